/* A C decode loop over the very libllama that llama-cpp-python loads: the floor of any
 * engine, in any language, that drives the same library (step_bench's single-stream row).
 *
 *     homelab-c-loop MODEL THREADS CTX      # built by benchmarks.llama_tools.build_c_loop
 *
 * The same work as benchmarks/bare_loop.py, without Python: one context, one sequence; set
 * the token, llama_decode, llama.cpp's greedy sampler. It speaks step_bench's protocol: a
 * {"ready": true} line, then for each line holding "tokens": N one line
 * {"value": tok/s, "between_us": median µs between one decode's return and the next start}.
 * Between it and llama-bench (linked statically, its next token random) lies what the
 * library's build and linking cost; between it and bare_loop.py, what Python costs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) level;
    (void) text;
    (void) data;
}

static int by_value(const void * a, const void * b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

/* The median gap, the first two decodes (warm-up) and the last one left out, as
 * benchmarks/decode_gaps.py's between_decodes_us. */
static double median_gap_us(const double * starts, const double * ends, int n) {
    int count = n - 4;
    if (count < 1) {
        return -1.0;
    }
    double * gaps = malloc(sizeof(double) * (size_t) count);
    for (int i = 0; i < count; i++) {
        gaps[i] = starts[i + 3] - ends[i + 2];
    }
    qsort(gaps, (size_t) count, sizeof(double), by_value);
    double median = count % 2 ? gaps[count / 2] : 0.5 * (gaps[count / 2 - 1] + gaps[count / 2]);
    free(gaps);
    return median * 1e6;
}

/* Decode n_tokens tokens from an empty cache; tok/s, and the median gap in *between_us. */
static double generate(struct llama_context * ctx, struct llama_sampler * greedy, int n_tokens,
                       double * between_us) {
    double * starts = malloc(sizeof(double) * (size_t) n_tokens);
    double * ends = malloc(sizeof(double) * (size_t) n_tokens);
    llama_memory_clear(llama_get_memory(ctx), true);
    llama_token token = 1;
    double started = now_s();
    for (int i = 0; i < n_tokens; i++) {
        starts[i] = now_s();
        if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) {
            fprintf(stderr, "llama_decode failed at token %d\n", i);
            exit(1);
        }
        ends[i] = now_s();
        token = llama_sampler_sample(greedy, ctx, -1);
    }
    double tok_s = n_tokens / (now_s() - started);
    *between_us = median_gap_us(starts, ends, n_tokens);
    free(starts);
    free(ends);
    return tok_s;
}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL THREADS CTX\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (model == NULL) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params params = llama_context_default_params();
    params.n_ctx = (uint32_t) atoi(argv[3]);
    params.n_batch = 2048;
    params.n_ubatch = 512;
    params.n_seq_max = 1;
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    params.no_perf = true;
    params.n_threads = params.n_threads_batch = atoi(argv[2]);
    struct llama_context * ctx = llama_init_from_model(model, params);
    struct llama_sampler * greedy = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(greedy, llama_sampler_init_greedy());
    double between_us;
    generate(ctx, greedy, 16, &between_us); /* warm: graphs built */
    printf("{\"ready\": true}\n");
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        const char * field = strstr(line, "\"tokens\"");
        const char * colon = field != NULL ? strchr(field, ':') : NULL;
        int n_tokens = colon != NULL ? atoi(colon + 1) : 0;
        if (n_tokens < 1) {
            fprintf(stderr, "no \"tokens\": N in %s", line);
            return 2;
        }
        double tok_s = generate(ctx, greedy, n_tokens, &between_us);
        printf("{\"value\": %.3f, \"between_us\": %.3f}\n", tok_s, between_us);
        fflush(stdout);
    }
    llama_sampler_free(greedy);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
