# GLM chat-format serving test model (owner: glm-chat).
#
# The DeepSeek demo architecture with the constructed GLM tokenizer
# (data/glm-constructed-tokenizer.json, 4096 ids) embedded: the server picks
# its chat format from the vocabulary's family, so the whole GLM chat path
# (rendering, tokenizing, stop tokens, tool-call parsing and streaming,
# replay, continuations) runs end to end without a GLM forward pass.
#   $(BUILD)/glmchat/glmtok-demo.gguf

$(BUILD)/glmchat/glmtok-demo.gguf: ds4-make-model data/glm-constructed-tokenizer.json
	@mkdir -p $(dir $@)
	@./ds4-make-model -o $@ --preset demo --vocab data/glm-constructed-tokenizer.json --vocab-added "" \
		--vocab_size 4096 --name glmtok-demo > $@.log 2>&1 || { cat $@.log; exit 1; }
TEST_DATA += $(BUILD)/glmchat/glmtok-demo.gguf
