# Read by llama.cpp's project() inside llama-cpp-python's build (the Makefile's LLAMA_CPP_CMAKE_ARGS): the GGUF
# tests load libllama and ggml only, so llama.cpp's common library (which llama-cpp-python forces on, and neither
# the Python package nor libllama uses) is not compiled. A plain variable here outranks that cache entry.
set(LLAMA_BUILD_COMMON OFF)
