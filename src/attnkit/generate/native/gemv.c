/* Matrix products for decoding on x86 CPUs with AVX2 and FMA (or AVX-512): y (M, N) = x (M, K) @ W^T, W (N, K)
 * stored in fp32, bf16, int8 with one scale per row, or 4 bits in groups of 32 inputs with a scale and an offset each.
 * Activations and arithmetic are fp32 in every form, but for bf16 rows of x on a CPU with AVX512-BF16
 * (`gemv_bf16_dot`: bf16 products summed in fp32); otherwise only the bytes a weight takes differ.
 *
 * Decoding reads every weight once per token, so these products are bound by reading W. Each output row is one
 * pass down a row of W. One row of x takes four independent accumulators, so that the additions do not wait on
 * one another (a single accumulator chain caps a product at one vector per addition's latency, below the memory's
 * rate for int8 and int4 weights); several rows of x (a batch of decoding rows, a prompt) go four at a time, each
 * widened weight vector shared by the four. Loads are unaligned (`loadu`): no row of W or x needs an alignment,
 * and every width K is taken, its tail by a scalar loop (`gemv_bf16_dot`: a masked load; 4-bit rows: K a multiple of
 * 32, which the caller pads to). Output rows are shared among `threads` OpenMP threads.
 *
 * One source, three builds: AVX2 with FMA; AVX-512 (F, BW, VL, DQ), which widens the 4-bit product's vectors; and
 * AVX-512 with AVX512-BF16, which adds `gemv_bf16_dot` for bf16 rows of x, and its twin `gemv_bf16_dot_to_bf16`
 * writing each sum rounded to bf16 (a bf16 layer's output as it is returned, with no conversion after the call).
 * Last, `attend_one`: attention of one decoding query a head over its cache (two matrix-vector passes and a softmax).
 * Built on first use by `attnkit/generate/native_gemv.py` with
 * the machine's C compiler and loaded through ctypes; `tests/fast_paths.py` holds each product equal to its
 * reference on drawn shapes.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INT4_GROUP 32

/* The products bound by reading W use 8-float vectors on every build: on an AVX-512 EPYC 16-float ones read W more
 * slowly (fp32 15.3 against 17.2 GB/s, int8 9.2 against 13.9, one thread). */
#define LANES 8
typedef __m256 vec;
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vadd _mm256_add_ps
#define vfma _mm256_fmadd_ps
static inline float hsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vec widen_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static inline vec widen_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* The 4-bit product, bound by widening its codes, uses the widest vectors the build has (`wvec`, W_LANES floats):
 * with AVX-512 it takes 7.7 ms where 8-float vectors take 9.1 over `gpt2-124m`'s weights. widen_i4 turns a group's
 * 16 bytes of codes into floats: codes 0-15 (the low halves) then 16-31 (the high halves). */
#ifdef __AVX512F__
#define W_LANES 16
typedef __m512 wvec;
#define wzero _mm512_setzero_ps
#define wload _mm512_loadu_ps
#define wset1 _mm512_set1_ps
#define wadd _mm512_add_ps
#define wmul _mm512_mul_ps
#define wfma _mm512_fmadd_ps
static inline float whsum(wvec v) { return _mm512_reduce_add_ps(v); }
static inline void widen_i4(const uint8_t *bytes16, wvec c[INT4_GROUP / W_LANES]) {
    const __m128i low_half = _mm_set1_epi8(0x0F);
    __m128i bytes = _mm_loadu_si128((const __m128i *)bytes16);
    c[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, low_half)));
    c[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), low_half)));
}
#else
#define W_LANES 8
typedef __m256 wvec;
#define wzero _mm256_setzero_ps
#define wload _mm256_loadu_ps
#define wset1 _mm256_set1_ps
#define wadd _mm256_add_ps
#define wmul _mm256_mul_ps
#define wfma _mm256_fmadd_ps
#define whsum hsum
static inline void widen_i4(const uint8_t *bytes16, wvec c[INT4_GROUP / W_LANES]) {
    const __m128i low_half = _mm_set1_epi8(0x0F);
    __m128i bytes = _mm_loadu_si128((const __m128i *)bytes16);
    __m128i low = _mm_and_si128(bytes, low_half);
    __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_half);
    c[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low));
    c[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(low, 8)));
    c[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(high));
    c[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(high, 8)));
}
#endif

static inline float bf16_to_float(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* fp32 -> bf16 rounded to nearest even, every NaN to 0xFFFF: PyTorch's conversion of a tensor (`.to(torch.bfloat16)`,
 * its vectorized loop), bit for bit */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFF;
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* `LANES` weights at p, widened to floats; and one weight, for the tails */
static inline vec widen_f32(const float *p) { return vload(p); }
static inline float one_f32(float v) { return v; }
static inline float one_i8(int8_t v) { return (float)v; }

/* rows_NAME(w, x, y, m, n, k, scale, add): y[r * n] = (W_row . x[r]) * scale + add for every row r of x; W_row of
 * type T, widened by WIDEN */
#define DEFINE_ROWS(NAME, T, WIDEN, ONE)                                                                          \
    static void rows_##NAME(const T *w, const float *x, float *y, int64_t m, int64_t n, int64_t k, float scale,  \
                            float add) {                                                                         \
        int64_t r = 0;                                                                                           \
        for (; r + 4 <= m; r += 4) { /* four rows of x share each widened weight vector, two accumulators each */ \
            const float *x0 = x + r * k, *x1 = x0 + k, *x2 = x1 + k, *x3 = x2 + k;                               \
            vec a0 = vzero(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;                     \
            int64_t j = 0;                                                                                       \
            for (; j + 2 * LANES <= k; j += 2 * LANES) {                                                         \
                vec v = WIDEN(w + j), u = WIDEN(w + j + LANES);                                                  \
                a0 = vfma(v, vload(x0 + j), a0), b0 = vfma(u, vload(x0 + j + LANES), b0);                        \
                a1 = vfma(v, vload(x1 + j), a1), b1 = vfma(u, vload(x1 + j + LANES), b1);                        \
                a2 = vfma(v, vload(x2 + j), a2), b2 = vfma(u, vload(x2 + j + LANES), b2);                        \
                a3 = vfma(v, vload(x3 + j), a3), b3 = vfma(u, vload(x3 + j + LANES), b3);                        \
            }                                                                                                    \
            for (; j + LANES <= k; j += LANES) {                                                                 \
                vec v = WIDEN(w + j);                                                                            \
                a0 = vfma(v, vload(x0 + j), a0);                                                                 \
                a1 = vfma(v, vload(x1 + j), a1);                                                                 \
                a2 = vfma(v, vload(x2 + j), a2);                                                                 \
                a3 = vfma(v, vload(x3 + j), a3);                                                                 \
            }                                                                                                    \
            float t0 = hsum(vadd(a0, b0)), t1 = hsum(vadd(a1, b1)), t2 = hsum(vadd(a2, b2));                     \
            float t3 = hsum(vadd(a3, b3));                                                                       \
            for (; j < k; j++) {                                                                                 \
                float v = ONE(w[j]);                                                                             \
                t0 += v * x0[j], t1 += v * x1[j], t2 += v * x2[j], t3 += v * x3[j];                              \
            }                                                                                                    \
            y[r * n] = t0 * scale + add, y[(r + 1) * n] = t1 * scale + add;                                      \
            y[(r + 2) * n] = t2 * scale + add, y[(r + 3) * n] = t3 * scale + add;                                \
        }                                                                                                        \
        for (; r < m; r++) { /* one row of x: four accumulators down the weight row */                           \
            const float *xr = x + r * k;                                                                         \
            vec a0 = vzero(), a1 = a0, a2 = a0, a3 = a0;                                                         \
            int64_t j = 0;                                                                                       \
            for (; j + 4 * LANES <= k; j += 4 * LANES) {                                                         \
                a0 = vfma(WIDEN(w + j), vload(xr + j), a0);                                                      \
                a1 = vfma(WIDEN(w + j + LANES), vload(xr + j + LANES), a1);                                      \
                a2 = vfma(WIDEN(w + j + 2 * LANES), vload(xr + j + 2 * LANES), a2);                              \
                a3 = vfma(WIDEN(w + j + 3 * LANES), vload(xr + j + 3 * LANES), a3);                              \
            }                                                                                                    \
            for (; j + LANES <= k; j += LANES) a0 = vfma(WIDEN(w + j), vload(xr + j), a0);                       \
            float total = hsum(vadd(vadd(a0, a1), vadd(a2, a3)));                                                \
            for (; j < k; j++) total += ONE(w[j]) * xr[j];                                                       \
            y[r * n] = total * scale + add;                                                                      \
        }                                                                                                        \
    }

DEFINE_ROWS(f32, float, widen_f32, one_f32)
DEFINE_ROWS(bf16, uint16_t, widen_bf16, bf16_to_float)
DEFINE_ROWS(i8, int8_t, widen_i8, one_i8)

/* Each product below adds `bias` (N,) to its outputs, or nothing where it is NULL. */
void gemv_f32(const float *w, const float *bias, const float *x, float *y, int64_t m, int64_t n, int64_t k,
              int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) rows_f32(w + i * k, x, y + i, m, n, k, 1.0f, bias ? bias[i] : 0.0f);
}

void gemv_bf16(const uint16_t *w, const float *bias, const float *x, float *y, int64_t m, int64_t n, int64_t k,
               int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) rows_bf16(w + i * k, x, y + i, m, n, k, 1.0f, bias ? bias[i] : 0.0f);
}

/* int8 weights with one fp32 scale per output row */
void gemv_i8(const int8_t *w, const float *scales, const float *bias, const float *x, float *y, int64_t m, int64_t n,
             int64_t k, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) rows_i8(w + i * k, x, y + i, m, n, k, scales[i], bias ? bias[i] : 0.0f);
}

/* bf16 weights against bf16 rows of x, with AVX512-BF16's dot product (`vdpbf16ps`): each instruction multiplies 16
 * pairs of bf16 numbers (a 256-bit vector of each) exactly (a product of two 8-bit significands fits in fp32's 24)
 * and adds each two neighbours' products into an fp32 sum; no widening, where `gemv_bf16` widens every weight and
 * reads fp32 inputs twice the size. Only the AVX512-BF16 build has it (`native_gemv.BUILDS`). The instruction treats
 * subnormal inputs as zero and flushes subnormal sums, and rounds each sum once to nearest even: the numbers of an
 * fp32 product up to the order of summation (and below 1.2e-38 in magnitude). The tail of a row (K not a multiple of
 * 16) is read by a masked load that fills the rest of the vector with zeros, whose products add nothing. */
#ifdef __AVX512BF16__
/* 256-bit vectors, as the widening products use (`LANES`): 16 bf16 numbers a load, 8 fp32 sums */
#define BF16_LANES 16
typedef __m256bh bvec;
#define dot _mm256_dpbf16_ps
static inline bvec bf16_load(const uint16_t *p, int64_t left) {
    __mmask16 mask = left >= BF16_LANES ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    return (bvec)_mm256_maskz_loadu_epi16(mask, p);
}
static inline bvec bf16_full(const uint16_t *p) { return (bvec)_mm256_loadu_si256((const __m256i *)p); }

/* y's element i set to v: fp32, or bf16 where `bf16_out` (the product's output in the rows' own dtype, so that a bf16
 * layer needs no conversion after the call: a second operator call a layer, which rivals the product at one row) */
static inline void put(void *y, int64_t i, float v, int bf16_out) {
    if (bf16_out)
        ((uint16_t *)y)[i] = float_to_bf16(v);
    else
        ((float *)y)[i] = v;
}

/* y[r * n] = W_row . x[r] + add for every row r of x (k apart): four rows of x at a time sharing each weight vector,
 * two sums a row; then one row at a time, four sums down the weight row */
static void rows_bf16_dot(const uint16_t *w, const uint16_t *x, void *y, int64_t m, int64_t n, int64_t k, float add,
                          int bf16_out) {
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) {
        const uint16_t *x0 = x + r * k, *x1 = x0 + k, *x2 = x1 + k, *x3 = x2 + k;
        vec a0 = vzero(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int64_t j = 0;
        for (; j + 2 * BF16_LANES <= k; j += 2 * BF16_LANES) {
            bvec v = bf16_full(w + j), u = bf16_full(w + j + BF16_LANES);
            a0 = dot(a0, v, bf16_full(x0 + j)), b0 = dot(b0, u, bf16_full(x0 + j + BF16_LANES));
            a1 = dot(a1, v, bf16_full(x1 + j)), b1 = dot(b1, u, bf16_full(x1 + j + BF16_LANES));
            a2 = dot(a2, v, bf16_full(x2 + j)), b2 = dot(b2, u, bf16_full(x2 + j + BF16_LANES));
            a3 = dot(a3, v, bf16_full(x3 + j)), b3 = dot(b3, u, bf16_full(x3 + j + BF16_LANES));
        }
        for (; j < k; j += BF16_LANES) {
            bvec v = bf16_load(w + j, k - j);
            a0 = dot(a0, v, bf16_load(x0 + j, k - j)), a1 = dot(a1, v, bf16_load(x1 + j, k - j));
            a2 = dot(a2, v, bf16_load(x2 + j, k - j)), a3 = dot(a3, v, bf16_load(x3 + j, k - j));
        }
        put(y, r * n, hsum(vadd(a0, b0)) + add, bf16_out), put(y, (r + 1) * n, hsum(vadd(a1, b1)) + add, bf16_out);
        put(y, (r + 2) * n, hsum(vadd(a2, b2)) + add, bf16_out);
        put(y, (r + 3) * n, hsum(vadd(a3, b3)) + add, bf16_out);
    }
    for (; r < m; r++) {
        const uint16_t *xr = x + r * k;
        vec a0 = vzero(), a1 = a0, a2 = a0, a3 = a0;
        int64_t j = 0;
        for (; j + 4 * BF16_LANES <= k; j += 4 * BF16_LANES) {
            a0 = dot(a0, bf16_full(w + j), bf16_full(xr + j));
            a1 = dot(a1, bf16_full(w + j + BF16_LANES), bf16_full(xr + j + BF16_LANES));
            a2 = dot(a2, bf16_full(w + j + 2 * BF16_LANES), bf16_full(xr + j + 2 * BF16_LANES));
            a3 = dot(a3, bf16_full(w + j + 3 * BF16_LANES), bf16_full(xr + j + 3 * BF16_LANES));
        }
        for (; j < k; j += BF16_LANES) a0 = dot(a0, bf16_load(w + j, k - j), bf16_load(xr + j, k - j));
        put(y, r * n, hsum(vadd(vadd(a0, a1), vadd(a2, a3))) + add, bf16_out);
    }
}

static void bf16_dot(const uint16_t *w, const float *bias, const uint16_t *x, void *y, int64_t m, int64_t n, int64_t k,
                     int threads, int bf16_out) {
    size_t size = bf16_out ? sizeof(uint16_t) : sizeof(float);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++)
        rows_bf16_dot(w + i * k, x, (char *)y + i * size, m, n, k, bias ? bias[i] : 0.0f, bf16_out);
}

/* bf16 weights (N, K) against bf16 rows x (M, K) -> fp32 y (M, N) */
void gemv_bf16_dot(const uint16_t *w, const float *bias, const uint16_t *x, float *y, int64_t m, int64_t n, int64_t k,
                   int threads) {
    bf16_dot(w, bias, x, y, m, n, k, threads, 0);
}

/* the same, each fp32 sum rounded to bf16 as PyTorch rounds it -> bf16 y (M, N) */
void gemv_bf16_dot_to_bf16(const uint16_t *w, const float *bias, const uint16_t *x, uint16_t *y, int64_t m, int64_t n,
                           int64_t k, int threads) {
    bf16_dot(w, bias, x, y, m, n, k, threads, 1);
}
#endif

/* sum(code * x) over one group (codes widened by widen_i4), as W_LANES partial sums in two chains */
static inline wvec group_products(const wvec c[INT4_GROUP / W_LANES], const float *xg) {
    wvec even = wmul(c[0], wload(xg)), odd = wmul(c[1], wload(xg + W_LANES));
    for (int v = 2; v < INT4_GROUP / W_LANES; v += 2) {
        even = wfma(c[v], wload(xg + v * W_LANES), even);
        odd = wfma(c[v + 1], wload(xg + (v + 1) * W_LANES), odd);
    }
    return wadd(even, odd);
}

/* A group's weights are (code - 8) * scale + zero, so its share of a product is scale * sum(code * x) + offset *
 * sum(x), with offset = zero - 8 * scale; this is the second term, summed over a row's groups. */
static inline float i4_offset(const float *offsets, const float *x_sums, int64_t groups) {
    wvec acc = wzero();
    int64_t g = 0;
    for (; g + W_LANES <= groups; g += W_LANES) acc = wfma(wload(offsets + g), wload(x_sums + g), acc);
    float total = whsum(acc);
    for (; g < groups; g++) total += offsets[g] * x_sums[g];
    return total;
}

/* one weight row's sum(scale * sum(code * x)) against one row of x, two accumulators taking alternate groups */
static float dot_i4(const uint8_t *row, const float *scales, const float *x, int64_t groups) {
    wvec a0 = wzero(), a1 = a0, c[INT4_GROUP / W_LANES];
    int64_t g = 0;
    for (; g + 2 <= groups; g += 2) {
        widen_i4(row + g * (INT4_GROUP / 2), c);
        a0 = wfma(group_products(c, x + g * INT4_GROUP), wset1(scales[g]), a0);
        widen_i4(row + (g + 1) * (INT4_GROUP / 2), c);
        a1 = wfma(group_products(c, x + (g + 1) * INT4_GROUP), wset1(scales[g + 1]), a1);
    }
    if (g < groups) {
        widen_i4(row + g * (INT4_GROUP / 2), c);
        a0 = wfma(group_products(c, x + g * INT4_GROUP), wset1(scales[g]), a0);
    }
    return whsum(wadd(a0, a1));
}

/* the same against four rows of x (k apart), each group's widened codes shared by the four */
static void dot_i4_four(const uint8_t *row, const float *scales, const float *x, int64_t k, int64_t groups,
                        float out[4]) {
    wvec a0 = wzero(), a1 = a0, a2 = a0, a3 = a0, c[INT4_GROUP / W_LANES];
    for (int64_t g = 0; g < groups; g++) {
        widen_i4(row + g * (INT4_GROUP / 2), c);
        wvec s = wset1(scales[g]);
        const float *xg = x + g * INT4_GROUP;
        a0 = wfma(group_products(c, xg), s, a0);
        a1 = wfma(group_products(c, xg + k), s, a1);
        a2 = wfma(group_products(c, xg + 2 * k), s, a2);
        a3 = wfma(group_products(c, xg + 3 * k), s, a3);
    }
    out[0] = whsum(a0), out[1] = whsum(a1), out[2] = whsum(a2), out[3] = whsum(a3);
}

/* 4-bit weights in groups of 32 inputs (K a multiple of 32: codes (N, K / 2), in each group's 16 bytes byte j holds
 * code j in its low half and code j + 16 in its high half) with fp32 scales and offsets (N, K / 32); x_sums
 * (M, K / 32), each row of x summed over each group, is filled by the caller. */
void gemv_i4(const uint8_t *codes, const float *scales, const float *offsets, const float *bias, const float *x,
             const float *x_sums, float *y, int64_t m, int64_t n, int64_t k, int threads) {
    int64_t groups = k / INT4_GROUP;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = codes + i * (k / 2);
        const float *row_scales = scales + i * groups, *row_offsets = offsets + i * groups;
        float add = bias ? bias[i] : 0.0f;
        int64_t r = 0;
        for (; r + 4 <= m; r += 4) {
            float out[4];
            dot_i4_four(row, row_scales, x + r * k, k, groups, out);
            for (int u = 0; u < 4; u++)
                y[(r + u) * n + i] = out[u] + i4_offset(row_offsets, x_sums + (r + u) * groups, groups) + add;
        }
        for (; r < m; r++)
            y[r * n + i] = dot_i4(row, row_scales, x + r * k, groups) +
                           i4_offset(row_offsets, x_sums + r * groups, groups) + add;
    }
}

/* One decoding query per head against its cached keys and values: out = softmax(q k^T * scale) v over all S keys (no
 * mask: a single newest query may see every key a cache holds), in fp32 whatever the dtype (bf16 inputs widened as
 * read, the output rounded as PyTorch rounds it). q (B, H, D) and out (B, H, D) contiguous; k and v (B, Hkv, S, D) at
 * any strides but D's (1), given in elements; query head h reads key/value head h / (H / Hkv) (grouped queries).
 * SDPA's CPU kernel and the float32 products spend tens of microseconds a call in blocking and dispatch for what is a
 * few thousand multiply-adds at one query; this is two passes down the cache, as llama.cpp's vector attention is. */
static inline float dot_row(const void *a, const void *b, int64_t d, int bf16) {
    vec acc = vzero();
    int64_t j = 0;
    float total;
    if (bf16) {
        const uint16_t *x = a, *y = b;
        for (; j + LANES <= d; j += LANES) acc = vfma(widen_bf16(x + j), widen_bf16(y + j), acc);
        total = hsum(acc);
        for (; j < d; j++) total += bf16_to_float(x[j]) * bf16_to_float(y[j]);
    } else {
        const float *x = a, *y = b;
        for (; j + LANES <= d; j += LANES) acc = vfma(vload(x + j), vload(y + j), acc);
        total = hsum(acc);
        for (; j < d; j++) total += x[j] * y[j];
    }
    return total;
}

static inline float element(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* returns 0, or 1 where its scratch (S + D floats) could not be had */
int attend_one(const void *q, const void *k, const void *v, void *out, int64_t batch, int64_t heads, int64_t kv_heads,
               int64_t keys, int64_t d, int64_t k_batch, int64_t k_head, int64_t k_key, int64_t v_batch,
               int64_t v_head, int64_t v_key, float scale, int bf16) {
    float *scores = malloc((size_t)(keys + d) * sizeof(float)), *acc = scores + keys;
    if (scores == NULL) return 1;
    size_t size = bf16 ? sizeof(uint16_t) : sizeof(float);
    int64_t group = heads / kv_heads;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++) {
            const char *qh = (const char *)q + (b * heads + h) * d * size;
            const char *kh = (const char *)k + (b * k_batch + (h / group) * k_head) * size;
            const char *vh = (const char *)v + (b * v_batch + (h / group) * v_head) * size;
            float top = -INFINITY;
            for (int64_t s = 0; s < keys; s++) {
                scores[s] = dot_row(qh, kh + s * k_key * size, d, bf16) * scale;
                top = scores[s] > top ? scores[s] : top;
            }
            float total = 0.0f;
            for (int64_t s = 0; s < keys; s++) total += scores[s] = expf(scores[s] - top);
            for (int64_t j = 0; j < d; j++) acc[j] = 0.0f;
            for (int64_t s = 0; s < keys; s++) {
                const char *vs = vh + s * v_key * size;
                vec w = _mm256_set1_ps(scores[s]);
                int64_t j = 0;
                if (bf16)
                    for (; j + LANES <= d; j += LANES)
                        _mm256_storeu_ps(acc + j, vfma(w, widen_bf16((const uint16_t *)vs + j), vload(acc + j)));
                else
                    for (; j + LANES <= d; j += LANES)
                        _mm256_storeu_ps(acc + j, vfma(w, vload((const float *)vs + j), vload(acc + j)));
                for (; j < d; j++) acc[j] += scores[s] * element(vs, j, bf16);
            }
            for (int64_t j = 0; j < d; j++) {
                float value = acc[j] / total;
                if (bf16)
                    ((uint16_t *)out)[(b * heads + h) * d + j] = float_to_bf16(value);
                else
                    ((float *)out)[(b * heads + h) * d + j] = value;
            }
        }
    free(scores);
    return 0;
}
