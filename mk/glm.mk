# GLM 5.2 oracle models (owner: glm).
#
# tests/fixtures/glmtiny/<name> (transformers GlmMoeDsaForCausalLM, BF16
# safetensors + golden logits) converted to glm-dsa GGUFs for the tests:
#   $(BUILD)/glmtiny/<name>-<f32|f16|q8_0>.gguf

GLMTINY_MODELS := $(patsubst tests/fixtures/glmtiny/%/config.json,%,$(wildcard tests/fixtures/glmtiny/*/config.json))
GLMTINY_TYPES  := f32 f16 q8_0

define GLMTINY_RULE
$(BUILD)/glmtiny/$(1)-$(2).gguf: ds4-convert tests/fixtures/glmtiny/$(1)/config.json tests/fixtures/glmtiny/$(1)/model.safetensors
	@mkdir -p $$(dir $$@)
	@./ds4-convert tests/fixtures/glmtiny/$(1) $$@ --type $(2) --name glmtiny-$(1) > $$@.log 2>&1 || { cat $$@.log; exit 1; }
TEST_DATA += $(BUILD)/glmtiny/$(1)-$(2).gguf
endef
$(foreach m,$(GLMTINY_MODELS),$(foreach t,$(GLMTINY_TYPES),$(eval $(call GLMTINY_RULE,$(m),$(t)))))
