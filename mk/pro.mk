# V4 Pro test inputs (owner: pro).
#
# The PRO-shaped transformers oracle (tests/fixtures/ds4pro/P: BF16
# safetensors + golden logits, tests/oracles/ds4_pro_oracle.py) converted to
# $(BUILD)/ds4pro/P-<f32|f16>.gguf, and one random model with Pro's real
# per-layer shapes for the split residency test (tests/dist/test_pro_split_rss.py):
# two layers (ratios 128 and 4, both hash-routed), 6 experts so a token reads
# every routed expert, a 1024-id vocabulary so the embedding stays small.
DS4PRO_MODELS := $(patsubst tests/fixtures/ds4pro/%/config.json,%,$(wildcard tests/fixtures/ds4pro/*/config.json))
DS4PRO_TYPES  := f32 f16

define DS4PRO_RULE
$(BUILD)/ds4pro/$(1)-$(2).gguf: ds4-convert tests/fixtures/ds4pro/$(1)/config.json tests/fixtures/ds4pro/$(1)/model.safetensors
	@mkdir -p $$(dir $$@)
	@./ds4-convert tests/fixtures/ds4pro/$(1) $$@ --type $(2) --name ds4pro-$(1) > $$@.log 2>&1 || { cat $$@.log; exit 1; }
TEST_DATA += $(BUILD)/ds4pro/$(1)-$(2).gguf
endef
$(foreach m,$(DS4PRO_MODELS),$(foreach t,$(DS4PRO_TYPES),$(eval $(call DS4PRO_RULE,$(m),$(t)))))

PRO_SPLIT_MODEL := $(BUILD)/ds4pro/pro-shaped-2layer.gguf
$(PRO_SPLIT_MODEL): ds4-make-model
	@mkdir -p $(dir $@)
	@./ds4-make-model -o $@ --preset pro --layers 2 --no-vocab --vocab_size 1024 --expert_count 6 > $@.log 2>&1 || { cat $@.log; exit 1; }
TEST_DATA += $(PRO_SPLIT_MODEL)
