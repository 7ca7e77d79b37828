# Generated model files (owner: convert).
#
# The transformers oracle models (tests/fixtures/ds4tiny/{A,B,C}, BF16
# safetensors + golden logits) converted to DS4 GGUFs for the engine tests:
#   $(BUILD)/ds4tiny/<A|B|C>-<f32|f16|q8_0>.gguf
# and the random-weight demo model (real DeepSeek vocabulary, meaningless
# output) that `make demo` runs: models/demo.gguf.

DS4TINY_MODELS := $(patsubst tests/fixtures/ds4tiny/%/config.json,%,$(wildcard tests/fixtures/ds4tiny/*/config.json))
DS4TINY_TYPES  := f32 f16 q8_0

define DS4TINY_RULE
$(BUILD)/ds4tiny/$(1)-$(2).gguf: ds4-convert tests/fixtures/ds4tiny/$(1)/config.json tests/fixtures/ds4tiny/$(1)/model.safetensors
	@mkdir -p $$(dir $$@)
	@./ds4-convert tests/fixtures/ds4tiny/$(1) $$@ --type $(2) --name ds4tiny-$(1) > $$@.log 2>&1 || { cat $$@.log; exit 1; }
TEST_DATA += $(BUILD)/ds4tiny/$(1)-$(2).gguf
endef
$(foreach m,$(DS4TINY_MODELS),$(foreach t,$(DS4TINY_TYPES),$(eval $(call DS4TINY_RULE,$(m),$(t)))))

# Their MTP support files (tests/fixtures/ds4tiny/<X>/mtp: a random block and
# the logits of a reference built from transformers' modules,
# tests/oracles/ds4_mtp_oracle.py): $(BUILD)/ds4tiny/<X>-mtp-f32.gguf
define DS4TINY_MTP_RULE
$(BUILD)/ds4tiny/$(1)-mtp-f32.gguf: ds4-convert tests/fixtures/ds4tiny/$(1)/mtp/config.json tests/fixtures/ds4tiny/$(1)/mtp/model.safetensors
	@mkdir -p $$(dir $$@)
	@./ds4-convert tests/fixtures/ds4tiny/$(1)/mtp $$@ --type f32 --mtp > $$@.log 2>&1 || { cat $$@.log; exit 1; }
TEST_DATA += $(BUILD)/ds4tiny/$(1)-mtp-f32.gguf
endef
$(foreach m,$(DS4TINY_MODELS),$(eval $(call DS4TINY_MTP_RULE,$(m))))

.PHONY: demo-model
demo-model: models/demo.gguf models/demo-mtp.gguf models/demo-dspark.gguf
models/demo.gguf: ds4-make-model data/deepseek-v3-tokenizer.json tests/fixtures/tokenizer/v4-added-tokens.json
	@mkdir -p models
	./ds4-make-model --preset demo -o $@
# its MTP support file (random, for --mtp)
models/demo-mtp.gguf: ds4-make-model
	@mkdir -p models
	./ds4-make-model --preset demo --support mtp -o $@ 2>/dev/null
TEST_DATA += models/demo-mtp.gguf
# its DSpark support file (random, for --dspark)
models/demo-dspark.gguf: ds4-make-model
	@mkdir -p models
	./ds4-make-model --preset demo --support dspark -o $@ 2>/dev/null
TEST_DATA += models/demo-dspark.gguf

# The trained tiny DeepSeek V4 model (docs/tiny-model.md), the default model of
# `make demo`: committed xz-compressed (its ~125k vocabulary rows that the
# training data never used are one repeated row, which xz folds away), unpacked
# here. The random demo model above stays for the tests that want random weights.
.PHONY: tiny-model
tiny-model: models/ds4-tiny.gguf models/ds4-tiny-mtp.gguf models/ds4-tiny-dspark.gguf
models/ds4-tiny.gguf: data/ds4-tiny/ds4-tiny-q8_0.gguf.xz
	@mkdir -p models
	xz -dc $< > $@.tmp && mv $@.tmp $@
TEST_DATA += models/ds4-tiny.gguf
# Its trained MTP block (data/ds4-tiny/mtp.safetensors, the checkpoint's
# mtp.0.* names) as the support file for --mtp.
models/ds4-tiny-mtp.gguf: ds4-convert data/ds4-tiny/config.json data/ds4-tiny/mtp.safetensors
	@mkdir -p models $(BUILD)/ds4-tiny-mtp
	@ln -sf $(abspath data/ds4-tiny/config.json) $(BUILD)/ds4-tiny-mtp/config.json
	@ln -sf $(abspath data/ds4-tiny/mtp.safetensors) $(BUILD)/ds4-tiny-mtp/model.safetensors
	@./ds4-convert $(BUILD)/ds4-tiny-mtp $@ --type q8_0 --mtp --name tiny-mtp > $(BUILD)/ds4-tiny-mtp/log 2>&1 || { cat $(BUILD)/ds4-tiny-mtp/log; exit 1; }
TEST_DATA += models/ds4-tiny-mtp.gguf
# Its trained DSpark block drafter (tools/train-tiny/train_dspark.py; F16
# matrices), for --mtp FILE --dspark
models/ds4-tiny-dspark.gguf: data/ds4-tiny/ds4-tiny-dspark.gguf.xz
	@mkdir -p models
	xz -dc $< > $@.tmp && mv $@.tmp $@
TEST_DATA += models/ds4-tiny-dspark.gguf
