# GLM chat-format serving test model (owner: glm-chat).
#
# ds4-make-model's glm-demo: the GLM 5.2 architecture with tiny dims and
# random weights, carrying the constructed GLM tokenizer
# (data/glm-constructed-tokenizer.json). The server picks its chat format
# from the vocabulary's family, so test_server_glm serves GLM end to end.
#   $(BUILD)/glmchat/glm-demo.gguf

$(BUILD)/glmchat/glm-demo.gguf: ds4-make-model data/glm-constructed-tokenizer.json
	@mkdir -p $(dir $@)
	@./ds4-make-model -o $@ --preset glm-demo > $@.log 2>&1 || { cat $@.log; exit 1; }
TEST_DATA += $(BUILD)/glmchat/glm-demo.gguf
