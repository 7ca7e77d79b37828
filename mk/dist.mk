# Layer-slice test inputs (owner: dist): one random model and the two split
# files ds4-make-model --slice writes for it, as the released PRO halves are
# split. Bigger experts than the demo model so a slice's bytes stand well
# above the process's own pages in the RSS check (tests/unit/test_layer_slice.c).
DIST_MODEL_ARGS := --preset demo --layers 8 --type q8_0 --no-vocab --vocab_size 1024 \
                   --expert_count 16 --expert_feed_forward_length 512
DIST_SLICES := $(BUILD)/dist/slice-0-3.gguf:0:3 $(BUILD)/dist/slice-4-output.gguf:4:output

$(BUILD)/dist/whole.gguf: ds4-make-model
	@mkdir -p $(dir $@)
	@./ds4-make-model -o $@ $(DIST_MODEL_ARGS) > $@.log 2>&1 || { cat $@.log; exit 1; }
TEST_DATA += $(BUILD)/dist/whole.gguf

define DIST_SLICE_RULE
$(word 1,$(subst :, ,$(1))): ds4-make-model
	@mkdir -p $$(dir $$@)
	@./ds4-make-model -o $$@ $(DIST_MODEL_ARGS) --slice $(word 2,$(subst :, ,$(1))):$(word 3,$(subst :, ,$(1))) > $$@.log 2>&1 || { cat $$@.log; exit 1; }
TEST_DATA += $(word 1,$(subst :, ,$(1)))
endef
$(foreach s,$(DIST_SLICES),$(eval $(call DIST_SLICE_RULE,$(s))))
