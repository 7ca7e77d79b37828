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

.PHONY: demo-model
demo-model: models/demo.gguf
models/demo.gguf: ds4-make-model data/deepseek-v3-tokenizer.json tests/fixtures/tokenizer/v4-added-tokens.json
	@mkdir -p models
	./ds4-make-model --preset demo -o $@

# The trained tiny DeepSeek V4 model (docs/tiny-model.md), the default model of
# `make demo`: committed xz-compressed (its ~125k vocabulary rows that the
# training data never used are one repeated row, which xz folds away), unpacked
# here. The random demo model above stays for the tests that want random weights.
.PHONY: tiny-model
tiny-model: models/ds4-tiny.gguf
models/ds4-tiny.gguf: data/ds4-tiny/ds4-tiny-q8_0.gguf.xz
	@mkdir -p models
	xz -dc $< > $@.tmp && mv $@.tmp $@
TEST_DATA += models/ds4-tiny.gguf
