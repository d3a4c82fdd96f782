#include "bench/runc_reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void runc_alloc(const RuncWeights* w, RuncState* s) {
  const int kv_dim = w->dim / w->n_heads * w->n_kv_heads;
  s->x = calloc(w->dim, sizeof(float));
  s->xb = calloc(w->dim, sizeof(float));
  s->xb2 = calloc(w->dim, sizeof(float));
  s->hb = calloc(w->hidden_dim, sizeof(float));
  s->hb2 = calloc(w->hidden_dim, sizeof(float));
  s->q = calloc(w->dim, sizeof(float));
  s->att = calloc((size_t)w->n_heads * w->seq_len, sizeof(float));
  s->logits = calloc(w->vocab_size, sizeof(float));
  s->key_cache = calloc((size_t)w->n_layers * w->seq_len * kv_dim, sizeof(float));
  s->value_cache = calloc((size_t)w->n_layers * w->seq_len * kv_dim, sizeof(float));
}

void runc_free(RuncState* s) {
  free(s->x); free(s->xb); free(s->xb2); free(s->hb); free(s->hb2); free(s->q); free(s->att);
  free(s->logits); free(s->key_cache); free(s->value_cache);
}

static void rmsnorm(float* o, const float* x, const float* w, int n, float eps) {
  float ss = 0.0f;
  for (int j = 0; j < n; j++) ss += x[j] * x[j];
  ss = 1.0f / sqrtf(ss / n + eps);
  for (int j = 0; j < n; j++) o[j] = w[j] * (ss * x[j]);
}

/* out[d] = w[d, n] @ x[n] */
static void matmul(float* out, const float* x, const float* w, int n, int d) {
  int i;
#pragma omp parallel for private(i)
  for (i = 0; i < d; i++) {
    float v = 0.0f;
    const float* row = w + (size_t)i * n;
    for (int j = 0; j < n; j++) v += row[j] * x[j];
    out[i] = v;
  }
}

static void softmax(float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; i++) if (x[i] > m) m = x[i];
  float sum = 0.0f;
  for (int i = 0; i < n; i++) { x[i] = expf(x[i] - m); sum += x[i]; }
  for (int i = 0; i < n; i++) x[i] /= sum;
}

static void rope(float* v, int n_heads, int hs, int pos, float theta, int interleaved) {
  for (int h = 0; h < n_heads; h++) {
    float* x = v + h * hs;
    for (int i = 0; i < hs / 2; i++) {
      const float f = 1.0f / powf(theta, (float)(2 * i) / hs);
      const float c = cosf(pos * f), s = sinf(pos * f);
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + hs / 2;
      const float x0 = x[a], x1 = x[b];
      x[a] = x0 * c - x1 * s;
      x[b] = x0 * s + x1 * c;
    }
  }
}

float* runc_forward(const RuncWeights* w, RuncState* s, int token, int pos) {
  const int dim = w->dim, hs = dim / w->n_heads, kv_dim = hs * w->n_kv_heads;
  const int kv_mul = w->n_heads / w->n_kv_heads, hidden = w->hidden_dim;
  memcpy(s->x, w->embed + (size_t)token * dim, dim * sizeof(float));
  for (int l = 0; l < w->n_layers; l++) {
    rmsnorm(s->xb, s->x, w->attn_norm[l], dim, w->norm_eps);
    const size_t loff = (size_t)l * w->seq_len * kv_dim;
    float* k = s->key_cache + loff + (size_t)pos * kv_dim;
    float* v = s->value_cache + loff + (size_t)pos * kv_dim;
    matmul(s->q, s->xb, w->wq[l], dim, dim);
    matmul(k, s->xb, w->wk[l], dim, kv_dim);
    matmul(v, s->xb, w->wv[l], dim, kv_dim);
    rope(s->q, w->n_heads, hs, pos, w->rope_theta, w->interleaved);
    rope(k, w->n_kv_heads, hs, pos, w->rope_theta, w->interleaved);
    int h;
#pragma omp parallel for private(h)
    for (h = 0; h < w->n_heads; h++) {
      const float* q = s->q + h * hs;
      float* att = s->att + (size_t)h * w->seq_len;
      for (int t = 0; t <= pos; t++) {
        const float* kt = s->key_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * hs;
        float score = 0.0f;
        for (int i = 0; i < hs; i++) score += q[i] * kt[i];
        att[t] = score / sqrtf((float)hs);
      }
      softmax(att, pos + 1);
      float* xb = s->xb + h * hs;
      memset(xb, 0, hs * sizeof(float));
      for (int t = 0; t <= pos; t++) {
        const float* vt = s->value_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * hs;
        for (int i = 0; i < hs; i++) xb[i] += att[t] * vt[i];
      }
    }
    matmul(s->xb2, s->xb, w->wo[l], dim, dim);
    for (int i = 0; i < dim; i++) s->x[i] += s->xb2[i];
    rmsnorm(s->xb, s->x, w->ffn_norm[l], dim, w->norm_eps);
    matmul(s->hb, s->xb, w->w_gate[l], dim, hidden);
    matmul(s->hb2, s->xb, w->w_up[l], dim, hidden);
    for (int i = 0; i < hidden; i++) {
      const float g = s->hb[i];
      s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
    }
    matmul(s->xb, s->hb, w->w_down[l], hidden, dim);
    for (int i = 0; i < dim; i++) s->x[i] += s->xb[i];
  }
  rmsnorm(s->x, s->x, w->final_norm, dim, w->norm_eps);
  matmul(s->logits, s->x, w->lm_head, dim, w->vocab_size);
  return s->logits;
}
