# The CLI, server and KV-cache tests run on the demo model (owner: lead).
TEST_DATA += models/demo.gguf
