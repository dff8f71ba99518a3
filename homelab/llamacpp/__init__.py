"""The doorway to llama.cpp: the only package in homelab that imports ``llama_cpp``.

Every raw call into llama-cpp-python's ctypes bindings lives here, behind typed classes whose
names say what they do; the engine, the planner's dry run, the quality evaluator, the
quantizer and the hardware report use these and never the C API. llama.cpp's failures
become :mod:`homelab.errors` types with a message that says what to do.

    _lib        the lazy ``import llama_cpp`` (log callback and backend init installed once)
    log         capture llama.cpp's log per thread; filter it to Python logging otherwise
    ggml_types  THE table of K/V cache type names -> ggml type ids
    model       ModelParams (GPU layers, CPU-kept MoE experts, dry run) and Model.load
    context     ContextParams and Context (decode, logits, sizes llama.cpp chose)
    embeddings  EmbeddingContext: pooled vectors per sequence (the model's pooling or one named)
    mtmd        Projector: a vision projector (libmtmd) — prompts with images, encode, decode
    batch       Batch: tokens with positions, sequence ids and output flags
    vocab       Vocab: tokenize / detokenize, BOS / EOS / end-of-generation tokens
    memory      SequenceMemory: clear, drop a suffix, copy, first / last position
    state       a sequence's state to bytes and back (whole, or the SWA / recurrent part)
    logits      a decode's logits as numpy views
    sampler     SamplerChain: llama.cpp's sampler-chain API
    candidates  the distribution a chain picks from (speculative sampling's acceptance rule)
    quantize    llama_model_quantize with progress, and its dry run for the output size
    backend     build facts (version, GPU offload, RPC, system info) and ggml's device registry
    rpc         RPC workers: handshake from Python, remote devices registered, a worker in-process
    grammar     JSON schema -> GBNF

Importing this package (or any module but ``logits`` and ``candidates``) is cheap:
llama-cpp-python's shared library loads on the first call that needs it, and numpy only with
those two.
"""
