// Causal self-attention, forward and backward, float32, for CPUs.
//
// Why this exists: with the small head sizes of CPU-sized models (debugmodel: 16 channels)
// ATen's CPU flash kernel spends its time in memory-bound GEMM calls whose inner dimension
// is the head size. Here the head size is a compile-time constant (HEAD_DIM, a multiple of
// 16), a head row is one or a few 16-float vectors, and every score tile stays in L1.
//
// Layouts: q, k, v, out, grads are [batch, seq, heads, head_dim] with any strides whose last
// one is 1 (the natural layout of a linear layer's output, so no transposes are needed);
// lse is [batch, heads, seq], contiguous. Keys/values may have fewer heads than queries
// (grouped-query attention): query head h reads key/value head h / (H / Hkv).
//
// Document masking (optional): `starts` is [batch, seq] int64, contiguous, or null. Given, query
// i sees only keys starts[b][i] .. i (its own document in a packed window, block-causal);
// null is plain causal attention (starts[b][i] = 0), the same code path as before.
//
// Built and loaded by cpu_attention.py (c++ -O3 -march=native -fopenmp); plain GCC/Clang
// vector extensions, so the same source runs on AVX2, AVX-512 or NEON. The OpenMP runtime is
// the one torch already loaded, so its threads are torch's intra-op threads.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=<a multiple of 16>"
#endif

namespace {

constexpr int W = 16;        // floats per vector
constexpr int D = HEAD_DIM;  // channels per head
static_assert(D % W == 0, "HEAD_DIM must be a multiple of 16");
constexpr int DV = D / W;    // vectors per head row
constexpr int R = 8;         // query rows handled together (register blocking)
constexpr int C = 64;        // key columns per backward tile (its dk/dv sums stay in L1)

typedef float vf __attribute__((vector_size(64)));
typedef float vf_unaligned __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi __attribute__((vector_size(64)));

inline vf load(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vf_unaligned*>(p) = x; }
inline vf splat(float x) { return vf{} + x; }

inline float horizontal_max(vf x) {
  float m = x[0];
  for (int i = 1; i < W; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

inline float horizontal_sum(vf x) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += x[i];
  return s;
}

// e^x as 2^n * e^r, n = round(x / ln 2), |r| <= ln(2)/2, e^r by its degree-6 Taylor
// polynomial (relative error < 2e-7). Inputs below -87 are clamped: e^-87 is ~1e-38.
inline vf vector_exp(vf x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const vf r = (x - n * 0.693359375f) - n * (-2.12194440e-4f);            // ln 2 in two parts
  vf p = splat(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi exponent = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * reinterpret_cast<const vf&>(exponent);
}

float* alloc_floats(int64_t n) {
  void* p = nullptr;
  return posix_memalign(&p, 64, sizeof(float) * (n + W)) ? nullptr : static_cast<float*>(p);
}

struct Strides {  // element strides of a [batch, seq, heads, head_dim] tensor
  int64_t b, s, h;
};

// scores[r][j] = q_r . k_j for j < n_vectors * W, from keys transposed to kt [D][ld].
// q rows come pre-scaled; rows past `rows` are zero and their scores are not written.
inline void score_rows(const float (*q)[D], int rows, const float* kt, int64_t ld, int64_t n_vectors,
                       float* scores, int64_t scores_ld) {
  for (int64_t jv = 0; jv < n_vectors; ++jv) {
    vf acc[R] = {};
    const float* column = kt + jv * W;
    for (int d = 0; d < D; ++d) {
      const vf kd = load(column + d * ld);
      for (int r = 0; r < R; ++r) acc[r] += q[r][d] * kd;
    }
    for (int r = 0; r < rows; ++r) store(scores + r * scores_ld + jv * W, acc[r]);
  }
}

// dst [D][ld] = rows [first, first + n) of src transposed, zero-padded up to `padded` columns.
void transpose_rows(const float* src, int64_t stride, int64_t n, int64_t padded, int64_t ld, float* dst) {
  for (int64_t j = 0; j < padded; ++j)
    for (int d = 0; d < D; ++d) dst[d * ld + j] = j < n ? src[j * stride + d] : 0.f;
}

}  // namespace

extern "C" {

int titan_attention_head_dim() { return D; }

// out = softmax(scale * q k^T, causal) v, and lse = the log of each row's softmax denominator.
// Work items are (batch, query head) pairs; every item has the same amount of work.
int titan_attention_forward(const float* q, Strides sq, const float* k, Strides sk, const float* v, Strides sv,
                            float* out, Strides so, float* lse, const int64_t* starts, int64_t B, int64_t H,
                            int64_t Hkv, int64_t S, float scale, int n_threads) {
  int failed = 0;
  const int64_t ld = (S + W - 1) / W * W;
#pragma omp parallel num_threads(n_threads) reduction(| : failed)
  {
    float* kt = alloc_floats(D * ld);
    float* values = alloc_floats(ld * D);  // this head's values, contiguous: strided rows thrash the TLB
    float* scores = alloc_floats(R * ld);
    failed = !kt || !values || !scores;
    int64_t loaded_kv = -1;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < B * H; ++item) {
      if (failed) continue;
      const int64_t b = item / H, h = item % H, hk = h / (H / Hkv);
      if (loaded_kv != b * Hkv + hk) {  // consecutive items often share a key/value head
        transpose_rows(k + b * sk.b + hk * sk.h, sk.s, S, ld, ld, kt);
        for (int64_t j = 0; j < S; ++j)
          for (int c = 0; c < DV; ++c) store(values + j * D + c * W, load(v + b * sv.b + j * sv.s + hk * sv.h + c * W));
        loaded_kv = b * Hkv + hk;
      }
      for (int64_t i0 = 0; i0 < S; i0 += R) {
        const int rows = (int)(S - i0 < R ? S - i0 : R);
        const int64_t seen = i0 + rows;  // keys seen by the block's last row (causal)
        const int64_t n_vectors = (seen + W - 1) / W;
        // Documents start no later than at the query, so the block's first row has the
        // smallest start: key vectors wholly before it are never computed.
        const int64_t* row_starts = starts ? starts + b * S + i0 : nullptr;
        const int64_t first_vector = row_starts ? row_starts[0] / W : 0;
        const int64_t first = first_vector * W;
        float qs[R][D] = {};
        for (int r = 0; r < rows; ++r)
          for (int d = 0; d < D; ++d) qs[r][d] = q[b * sq.b + (i0 + r) * sq.s + h * sq.h + d] * scale;
        score_rows(qs, rows, kt + first, ld, n_vectors - first_vector, scores + first, ld);
        float inv_sum[R] = {};
        for (int r = 0; r < rows; ++r) {
          float* row = scores + r * ld;
          const int64_t n = i0 + r + 1;
          const int64_t lo = row_starts ? row_starts[r] : 0;  // keys before it are another document's
          for (int64_t j = n; j < n_vectors * W; ++j) row[j] = -INFINITY;
          for (int64_t j = first; j < lo; ++j) row[j] = -INFINITY;
          vf m = splat(-INFINITY);
          for (int64_t jv = first_vector; jv < n_vectors; ++jv) {
            const vf x = load(row + jv * W);
            m = x > m ? x : m;
          }
          const float row_max = horizontal_max(m);
          vf sum = {};
          for (int64_t jv = first_vector; jv < n_vectors; ++jv) {
            const vf p = vector_exp(load(row + jv * W) - row_max);
            store(row + jv * W, p);
            sum += p;
          }
          // Masked keys are zeroed after the exp (vector_exp clamps, so it never gives exactly 0;
          // their e^-87 in the sum is far below float precision).
          for (int64_t j = n; j < n_vectors * W; ++j) row[j] = 0.f;
          for (int64_t j = first; j < lo; ++j) row[j] = 0.f;
          const float total = horizontal_sum(sum);
          inv_sum[r] = 1.0f / total;
          lse[item * S + i0 + r] = row_max + logf(total);
        }
        for (int r = rows; r < R; ++r) memset(scores + r * ld, 0, sizeof(float) * n_vectors * W);
        vf acc[R][DV] = {};
        for (int64_t j = first; j < seen; ++j) {
          vf vj[DV];
          for (int c = 0; c < DV; ++c) vj[c] = load(values + j * D + c * W);
          for (int r = 0; r < R; ++r) {
            const float p = scores[r * ld + j];
            for (int c = 0; c < DV; ++c) acc[r][c] += p * vj[c];
          }
        }
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < DV; ++c) store(out + b * so.b + (i0 + r) * so.s + h * so.h + c * W, acc[r][c] * inv_sum[r]);
      }
    }
    free(kt);
    free(values);
    free(scores);
  }
  return failed;
}

// Gradients of the forward above. Work items are (batch, key/value head) pairs: an item owns
// its dk/dv rows and the dq rows of the query heads that share its key/value head, so no two
// threads write the same memory. Key blocks of C columns are the outer loop, so a block's
// dk/dv sums stay in L1 while every later query row passes over it.
int titan_attention_backward(const float* q, Strides sq, const float* k, Strides sk, const float* v, Strides sv,
                             const float* out, Strides so, const float* dout, Strides sdo, const float* lse,
                             float* dq, Strides sdq, float* dk, Strides sdk, float* dv, Strides sdv,
                             const int64_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t S, float scale,
                             int n_threads) {
  int failed = 0;
  const int64_t group = H / Hkv;
#pragma omp parallel num_threads(n_threads) reduction(| : failed)
  {
    float* kt = alloc_floats(D * C);
    float* vt = alloc_floats(D * C);
    float* keys = alloc_floats(C * D);
    float* probs = alloc_floats(R * C);
    float* dscores = alloc_floats(R * C);
    float* dk_block = alloc_floats(C * D);
    float* dv_block = alloc_floats(C * D);
    // Per query head of the group, rows padded to a multiple of R with zeros: scale * q and
    // dout as contiguous rows (every key block re-reads them), the row's logsumexp and
    // delta = rowsum(dout * out) = rowsum(P * dP).
    const int64_t padded = (S + R - 1) / R * R;
    float* q_scaled = alloc_floats(group * padded * D);
    float* grads = alloc_floats(group * padded * D);
    float* row_lse = alloc_floats(group * padded);
    float* delta = alloc_floats(group * padded);
    failed = !kt || !vt || !keys || !probs || !dscores || !dk_block || !dv_block || !q_scaled || !grads ||
             !row_lse || !delta;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < B * Hkv; ++item) {
      if (failed) continue;
      const int64_t b = item / Hkv, hk = item % Hkv;
      const float* kb = k + b * sk.b + hk * sk.h;
      const float* vb = v + b * sv.b + hk * sv.h;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = hk * group + g;
        for (int64_t i = 0; i < padded; ++i) {
          float* qrow = q_scaled + (g * padded + i) * D;
          float* grow = grads + (g * padded + i) * D;
          if (i >= S) {
            memset(qrow, 0, sizeof(float) * D);
            memset(grow, 0, sizeof(float) * D);
            row_lse[g * padded + i] = delta[g * padded + i] = 0.f;
            continue;
          }
          vf dot = {};
          for (int c = 0; c < DV; ++c) {
            const vf gc = load(dout + b * sdo.b + i * sdo.s + h * sdo.h + c * W);
            dot += gc * load(out + b * so.b + i * so.s + h * so.h + c * W);
            store(grow + c * W, gc);
            store(qrow + c * W, load(q + b * sq.b + i * sq.s + h * sq.h + c * W) * scale);
            store(dq + b * sdq.b + i * sdq.s + h * sdq.h + c * W, vf{});
          }
          delta[g * padded + i] = horizontal_sum(dot);
          row_lse[g * padded + i] = lse[(b * H + h) * S + i];
        }
      }
      for (int64_t c0 = 0; c0 < S; c0 += C) {
        const int cols = (int)(S - c0 < C ? S - c0 : C);
        transpose_rows(kb + c0 * sk.s, sk.s, cols, C, C, kt);
        transpose_rows(vb + c0 * sv.s, sv.s, cols, C, C, vt);
        for (int j = 0; j < cols; ++j)
          for (int c = 0; c < DV; ++c) store(keys + j * D + c * W, load(kb + (c0 + j) * sk.s + c * W));
        memset(dk_block, 0, sizeof(float) * C * D);
        memset(dv_block, 0, sizeof(float) * C * D);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = hk * group + g;
          for (int64_t i0 = c0; i0 < S; i0 += R) {  // rows above the block see none of its keys
            const int rows = (int)(S - i0 < R ? S - i0 : R);
            // Starts never decrease along a row block, so its first row sees the most keys;
            // a block whose first row's document begins after these keys sees none of them.
            const int64_t* row_starts = starts ? starts + b * S + i0 : nullptr;
            if (row_starts && row_starts[0] >= c0 + cols) continue;
            const float(*qs)[D] = reinterpret_cast<const float(*)[D]>(q_scaled + (g * padded + i0) * D);
            const float(*gs)[D] = reinterpret_cast<const float(*)[D]>(grads + (g * padded + i0) * D);
            const float* lse_rows = row_lse + g * padded + i0;
            const float* delta_rows = delta + g * padded + i0;
            score_rows(qs, R, kt, C, C / W, probs, C);    // scale * q . k
            score_rows(gs, R, vt, C, C / W, dscores, C);  // dP = dout . v
            // Keys a row may not see (j > i), padding columns and missing rows get p = 0.
            const bool partial = i0 < c0 + C || rows < R || cols < C || row_starts;
            for (int r = 0; r < R; ++r) {
              float* prow = probs + r * C;
              float* drow = dscores + r * C;
              for (int jv = 0; jv < C / W; ++jv) {
                const vf p = vector_exp(load(prow + jv * W) - lse_rows[r]);
                store(prow + jv * W, p);
                store(drow + jv * W, p * (load(drow + jv * W) - delta_rows[r]));  // dS
              }
              if (partial) {
                int64_t visible = r < rows ? i0 + r + 1 - c0 : 0;
                if (visible > cols) visible = cols;
                for (int64_t j = visible; j < C; ++j) prow[j] = drow[j] = 0.f;
                // Keys of an earlier document (before the row's start) get p = 0 too.
                const int64_t hidden = r < rows && row_starts ? row_starts[r] - c0 : 0;
                for (int64_t j = 0; j < hidden && j < C; ++j) prow[j] = drow[j] = 0.f;
              }
            }
            vf dq_acc[R][DV] = {};
            const int64_t last = i0 + rows - c0;
            const int jend = (int)(last < cols ? last : cols);
            const int jstart = (int)(row_starts && row_starts[0] > c0 ? row_starts[0] - c0 : 0);
            for (int j = jstart; j < jend; ++j) {
              vf kj[DV], dkj[DV], dvj[DV];
              for (int c = 0; c < DV; ++c) {
                kj[c] = load(keys + j * D + c * W);
                dkj[c] = load(dk_block + j * D + c * W);
                dvj[c] = load(dv_block + j * D + c * W);
              }
              for (int r = 0; r < R; ++r) {
                const float ds = dscores[r * C + j], p = probs[r * C + j];
                for (int c = 0; c < DV; ++c) {
                  dq_acc[r][c] += ds * kj[c];
                  dkj[c] += ds * load(qs[r] + c * W);  // q is pre-scaled: dk = scale * dS^T q
                  dvj[c] += p * load(gs[r] + c * W);
                }
              }
              for (int c = 0; c < DV; ++c) {
                store(dk_block + j * D + c * W, dkj[c]);
                store(dv_block + j * D + c * W, dvj[c]);
              }
            }
            for (int r = 0; r < rows; ++r) {
              float* dqr = dq + b * sdq.b + (i0 + r) * sdq.s + h * sdq.h;
              for (int c = 0; c < DV; ++c) store(dqr + c * W, load(dqr + c * W) + dq_acc[r][c] * scale);
            }
          }
        }
        for (int j = 0; j < cols; ++j)
          for (int c = 0; c < DV; ++c) {
            store(dk + b * sdk.b + (c0 + j) * sdk.s + hk * sdk.h + c * W, load(dk_block + j * D + c * W));
            store(dv + b * sdv.b + (c0 + j) * sdv.s + hk * sdv.h + c * W, load(dv_block + j * D + c * W));
          }
      }
    }
    free(kt);
    free(vt);
    free(keys);
    free(probs);
    free(dscores);
    free(dk_block);
    free(dv_block);
    free(q_scaled);
    free(grads);
    free(row_lse);
    free(delta);
  }
  return failed;
}

}  // extern "C"
