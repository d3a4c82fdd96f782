/* runc_main MODEL.bin N TOKEN...: the startup baseline of bench/startup_bench.py, in the way of
 * llama2.c's run.c: map a llama2.c checkpoint, run the given prompt token ids and N greedy tokens
 * through bench/runc_reference.c, print the generated ids. Written for Specula, not copied. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/runc_reference.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: runc_main MODEL.bin N TOKEN...\n");
    return 2;
  }
  const int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    perror(argv[1]);
    return 1;
  }
  const int* h = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (h == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  /* Header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: unshared), seq_len. */
  RuncWeights w = {.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3], .n_kv_heads = h[4],
                   .vocab_size = abs(h[5]), .seq_len = h[6], .interleaved = 1, .rope_theta = 10000.0f,
                   .norm_eps = 1e-5f};
  const int L = w.n_layers, dim = w.dim, kv = dim / w.n_heads * w.n_kv_heads, hid = w.hidden_dim;
  const float* p = (const float*)(h + 7);
  w.embed = p;
  p += (size_t)w.vocab_size * dim;
  const float*** arrays[9] = {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.ffn_norm, &w.w_gate, &w.w_down, &w.w_up};
  const size_t sizes[9] = {dim, (size_t)dim * dim, (size_t)dim * kv, (size_t)dim * kv, (size_t)dim * dim, dim,
                           (size_t)dim * hid, (size_t)hid * dim, (size_t)dim * hid};
  for (int a = 0; a < 9; a++) { /* llama2.c order: rms_att wq wk wv wo rms_ffn w1 w2 w3 */
    const float** v = malloc(L * sizeof(float*));
    for (int l = 0; l < L; l++) v[l] = p + (size_t)l * sizes[a];
    *arrays[a] = v;
    p += (size_t)L * sizes[a];
  }
  w.final_norm = p;
  p += dim + (size_t)w.seq_len * (dim / w.n_heads); /* skip freq_cis_real and _imag */
  w.lm_head = h[5] > 0 ? w.embed : p;
  RuncState s;
  runc_alloc(&w, &s);
  const int n = atoi(argv[2]), prompt = argc - 3;
  int token = atoi(argv[3]);
  for (int pos = 0; pos < prompt + n - 1; pos++) {
    const float* logits = runc_forward(&w, &s, token, pos);
    if (pos + 1 < prompt) {
      token = atoi(argv[4 + pos]);
      continue;
    }
    int best = 0;
    for (int i = 1; i < w.vocab_size; i++) best = logits[i] > logits[best] ? i : best;
    printf("%d\n", token = best);
  }
  runc_free(&s);
  return 0;
}
