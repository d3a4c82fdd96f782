/* A plain C forward pass in the llama2.c run.c style: contiguous KV cache, one token per call,
 * matrix-vector products parallelized with OpenMP. It is the speed baseline for single-sequence
 * decoding ("at least as fast as run.c with OpenMP matmuls"); written for Specula, not copied. */
#ifndef SPECULA_BENCH_RUNC_REFERENCE_H_
#define SPECULA_BENCH_RUNC_REFERENCE_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, interleaved;
  float rope_theta, norm_eps;
  const float* embed;                         /* [vocab, dim] */
  const float** attn_norm;                    /* [n_layers] of [dim] */
  const float **wq, **wk, **wv, **wo;         /* [n_layers] of [out, in] */
  const float** ffn_norm;                     /* [n_layers] of [dim] */
  const float **w_gate, **w_up, **w_down;     /* [n_layers] of [out, in] */
  const float* final_norm;                    /* [dim] */
  const float* lm_head;                       /* [vocab, dim] */
} RuncWeights;

typedef struct {
  float *x, *xb, *xb2, *hb, *hb2, *q, *att, *logits; /* activations */
  float *key_cache, *value_cache;                    /* [n_layers, seq_len, kv_dim] */
} RuncState;

void runc_alloc(const RuncWeights* w, RuncState* s);
void runc_free(RuncState* s);
/* Returns logits [vocab] for `token` at position `pos`. */
float* runc_forward(const RuncWeights* w, RuncState* s, int token, int pos);

#ifdef __cplusplus
}
#endif

#endif
