/* Native convolution kernels (float32, and 8-bit depthwise) of the nnhal reference driver.
 *
 * Compiled at first use by nnhal/ops/native/build.py and called through ctypes. All data is
 * NHWC float32, C-contiguous; accumulation in float32; the bias and the clamp of the fused
 * activation are applied in the same pass as the store. The clamp keeps NaN (a comparison
 * with NaN is false, so the value passes through unchanged), as numpy's clip does.
 *
 * Geometry is passed as an int64 array (see the P_* indices below, mirrored in __init__.py),
 * built once per input shape by the caller, so that one ctypes call carries few arguments.
 */
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

typedef float v8f __attribute__((vector_size(32)));

enum {
    P_N, P_H, P_W, P_C,        /* input: batch, height, width, channels */
    P_OH, P_OW, P_COUT,        /* output height, width, channels */
    P_KH, P_KW,                /* filter height, width */
    P_SH, P_SW, P_DH, P_DW,    /* strides and dilations */
    P_PT, P_PL,                /* top and left padding (bottom/right follow from OH/OW) */
    P_MULT,                    /* depth multiplier (depthwise only) */
    P_COUNT
};

static inline float clampf(float v, float lo, float hi)
{
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

static inline v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8_clamped(float *p, v8f v, float lo, float hi)
{
    float t[8];
    memcpy(t, &v, sizeof t);
    for (int k = 0; k < 8; k++)
        p[k] = clampf(t[k], lo, hi);
}

/* Version of the parameter layout; the loader checks it. */
int64_t nnhal_abi_version(void) { return 5; }

/* The taps [k0, k1) of a filter axis of size k that land inside [0, size) from position i0
 * (= output position * stride - padding) with dilation d. */
static inline void tap_range(int64_t i0, int64_t k, int64_t d, int64_t size,
                             int64_t *k0, int64_t *k1)
{
    int64_t a = 0, b = k;
    while (a < k && i0 + a * d < 0) a++;
    while (b > a && i0 + (b - 1) * d >= size) b--;
    *k0 = a;
    *k1 = b;
}

/* First and one-past-last output position whose taps all land inside the input. */
static inline void interior(int64_t o, int64_t s, int64_t pad, int64_t k, int64_t d,
                            int64_t size, int64_t *lo_out, int64_t *hi_out)
{
    int64_t lo = (pad + s - 1) / s;               /* o*s - pad >= 0 */
    int64_t last = size - 1 + pad - (k - 1) * d;  /* o*s <= last */
    int64_t hi = last < 0 ? 0 : last / s + 1;
    if (hi > o) hi = o;
    if (lo > hi) lo = hi;
    *lo_out = lo;
    *hi_out = hi;
}

/* One output pixel of a depthwise convolution, every channel, taps clipped to the input. */
static void dw_pixel(const float *ib, float *op, const int64_t *p, const float *filt,
                     const float *bias, float lo, float hi, int64_t iy0, int64_t ix0)
{
    const int64_t w = p[P_W], c = p[P_C], cout = p[P_COUT], kw = p[P_KW];
    const int64_t dh = p[P_DH], dw = p[P_DW], m = p[P_MULT];
    const int64_t cv = (m == 1) ? (cout / 8) * 8 : 0; /* channels done 8 at a time */
    int64_t ky0, ky1, kx0, kx1;
    tap_range(iy0, p[P_KH], dh, p[P_H], &ky0, &ky1);
    tap_range(ix0, kw, dw, w, &kx0, &kx1);
    for (int64_t co = 0; co < cv; co += 8) {
        v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t ky = ky0; ky < ky1; ky++) {
            const float *irow = ib + (iy0 + ky * dh) * w * c + co;
            const float *frow = filt + ky * kw * cout + co;
            for (int64_t kx = kx0; kx < kx1; kx++)
                acc += load8(irow + (ix0 + kx * dw) * c) * load8(frow + kx * cout);
        }
        acc += load8(bias + co);
        store8_clamped(op + co, acc, lo, hi);
    }
    for (int64_t co = cv; co < cout; co++) {
        const int64_t ci = co / m;
        float acc = 0.0f;
        for (int64_t ky = ky0; ky < ky1; ky++) {
            const float *irow = ib + (iy0 + ky * dh) * w * c + ci;
            const float *frow = filt + ky * kw * cout + co;
            for (int64_t kx = kx0; kx < kx1; kx++)
                acc += irow[(ix0 + kx * dw) * c] * frow[kx * cout];
        }
        op[co] = clampf(acc + bias[co], lo, hi);
    }
}

/* Depthwise convolution. filt is [KH][KW][COUT] (the NNAPI filter [1, KH, KW, COUT] as is),
 * output channel co reads input channel co / MULT.
 *
 * Fast path (3x3, unit dilation, multiplier 1, channels a multiple of 8): for each output row
 * whose taps are all inside the input, one 8-channel block at a time, the nine filter vectors
 * and the bias stay in registers across the interior of the row. Other pixels: dw_pixel. */
void nnhal_dwconv_f32(const float *in, float *out, const int64_t *p, const float *filt,
                      const float *bias, float lo, float hi)
{
    const int64_t n = p[P_N], h = p[P_H], w = p[P_W], c = p[P_C];
    const int64_t oh = p[P_OH], ow = p[P_OW], cout = p[P_COUT];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL];
    const int fast = kh == 3 && kw == 3 && dh == 1 && dw == 1 && p[P_MULT] == 1 && c % 8 == 0;
    int64_t xl, xr, yl, yr;
    interior(ow, sw, pl, kw, dw, w, &xl, &xr);
    interior(oh, sh, pt, kh, dh, h, &yl, &yr);

    for (int64_t b = 0; b < n; b++) {
        const float *ib = in + b * h * w * c;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            float *orow = out + ((b * oh + oy) * ow) * cout;
            if (!fast || oy < yl || oy >= yr) {
                for (int64_t ox = 0; ox < ow; ox++)
                    dw_pixel(ib, orow + ox * cout, p, filt, bias, lo, hi, iy0, ox * sw - pl);
                continue;
            }
            for (int64_t ox = 0; ox < xl; ox++)
                dw_pixel(ib, orow + ox * cout, p, filt, bias, lo, hi, iy0, ox * sw - pl);
            for (int64_t ox = xr; ox < ow; ox++)
                dw_pixel(ib, orow + ox * cout, p, filt, bias, lo, hi, iy0, ox * sw - pl);
            const float *r0 = ib + iy0 * w * c, *r1 = r0 + w * c, *r2 = r1 + w * c;
            for (int64_t co = 0; co < c; co += 8) {
                const v8f f00 = load8(filt + 0 * cout + co), f01 = load8(filt + 1 * cout + co),
                          f02 = load8(filt + 2 * cout + co), f10 = load8(filt + 3 * cout + co),
                          f11 = load8(filt + 4 * cout + co), f12 = load8(filt + 5 * cout + co),
                          f20 = load8(filt + 6 * cout + co), f21 = load8(filt + 7 * cout + co),
                          f22 = load8(filt + 8 * cout + co), bv = load8(bias + co);
                for (int64_t ox = xl; ox < xr; ox++) {
                    const int64_t o = (ox * sw - pl) * c + co;
                    v8f acc = load8(r0 + o) * f00;
                    acc += load8(r0 + o + c) * f01;
                    acc += load8(r0 + o + 2 * c) * f02;
                    acc += load8(r1 + o) * f10;
                    acc += load8(r1 + o + c) * f11;
                    acc += load8(r1 + o + 2 * c) * f12;
                    acc += load8(r2 + o) * f20;
                    acc += load8(r2 + o + c) * f21;
                    acc += load8(r2 + o + 2 * c) * f22;
                    acc += bv;
                    store8_clamped(orow + ox * cout + co, acc, lo, hi);
                }
            }
        }
    }
}

/* One output pixel of a direct convolution: NB blocks of 8 output channels accumulated at
 * once, so each input value is loaded and broadcast once per tap. */
static inline __attribute__((always_inline)) void
direct_pixel(const float *ib, float *op, const int64_t *p, const float *fb, int64_t blk,
             const float *bias, float lo, float hi, int64_t iy0, int64_t ix0, const int nb,
             int64_t cb0)
{
    const int64_t w = p[P_W], c = p[P_C], cout = p[P_COUT], kw = p[P_KW];
    const int64_t dh = p[P_DH], dw = p[P_DW];
    int64_t ky0, ky1, kx0, kx1;
    tap_range(iy0, p[P_KH], dh, p[P_H], &ky0, &ky1);
    tap_range(ix0, kw, dw, w, &kx0, &kx1);
    v8f acc[4] = {{0}};
    for (int64_t ky = ky0; ky < ky1; ky++) {
        const float *irow = ib + (iy0 + ky * dh) * w * c;
        for (int64_t kx = kx0; kx < kx1; kx++) {
            const float *ip = irow + (ix0 + kx * dw) * c;
            const float *fp = fb + ((ky * kw + kx) * c) * 8;
            for (int64_t ci = 0; ci < c; ci++) {
                const float v = ip[ci];
                for (int j = 0; j < nb; j++)
                    acc[j] += v * load8(fp + j * blk + ci * 8);
            }
        }
    }
    for (int j = 0; j < nb; j++) {
        const int64_t cb = (cb0 + j) * 8;
        if (cb + 8 <= cout) {
            store8_clamped(op + cb, acc[j] + load8(bias + cb), lo, hi);
        } else {
            float t[8];
            memcpy(t, &acc[j], sizeof t);
            for (int64_t k = 0; cb + k < cout; k++)
                op[cb + k] = clampf(t[k] + bias[cb + k], lo, hi);
        }
    }
}

/* PX horizontally adjacent interior output pixels (every tap inside the input) times NB
 * blocks of 8 output channels: PX * NB independent accumulators hide the add latency. */
static inline __attribute__((always_inline)) void
direct_multi(const float *ib, float *op, const int64_t *p, const float *fb, int64_t blk,
             const float *bias, float lo, float hi, int64_t iy0, int64_t ix0, const int px,
             const int nb)
{
    const int64_t w = p[P_W], c = p[P_C], cout = p[P_COUT], kh = p[P_KH], kw = p[P_KW];
    const int64_t dh = p[P_DH], dw = p[P_DW], sw = p[P_SW];
    v8f acc[4][2];
    for (int i = 0; i < px; i++)
        for (int j = 0; j < nb; j++)
            acc[i][j] = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t ky = 0; ky < kh; ky++) {
        const float *irow = ib + (iy0 + ky * dh) * w * c;
        for (int64_t kx = 0; kx < kw; kx++) {
            const float *ip = irow + (ix0 + kx * dw) * c;
            const float *fp = fb + ((ky * kw + kx) * c) * 8;
            for (int64_t ci = 0; ci < c; ci++) {
                v8f f[2];
                for (int j = 0; j < nb; j++)
                    f[j] = load8(fp + j * blk + ci * 8);
                for (int i = 0; i < px; i++) {
                    const float v = ip[i * sw * c + ci];
                    for (int j = 0; j < nb; j++)
                        acc[i][j] += v * f[j];
                }
            }
        }
    }
    for (int i = 0; i < px; i++)
        for (int j = 0; j < nb; j++) {
            const int64_t cb = j * 8;
            float *o = op + i * cout;
            if (cb + 8 <= cout) {
                store8_clamped(o + cb, acc[i][j] + load8(bias + cb), lo, hi);
            } else {
                float t[8];
                memcpy(t, &acc[i][j], sizeof t);
                for (int64_t k = 0; cb + k < cout; k++)
                    o[cb + k] = clampf(t[k] + bias[cb + k], lo, hi);
            }
        }
}

/* Direct convolution for few input channels. filt is packed by the caller as
 * [ceil(COUT/8)][KH][KW][C][8] (zero-padded output channels); bias is [COUT]. */
void nnhal_conv_direct_f32(const float *in, float *out, const int64_t *p, const float *filt,
                           const float *bias, float lo, float hi)
{
    const int64_t n = p[P_N], h = p[P_H], w = p[P_W], c = p[P_C];
    const int64_t oh = p[P_OH], ow = p[P_OW], cout = p[P_COUT];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t pt = p[P_PT], pl = p[P_PL], dh = p[P_DH], dw = p[P_DW];
    const int64_t nb = (cout + 7) / 8;
    const int64_t blk = kh * kw * c * 8; /* floats of one packed output-channel block */
    int64_t xl, xr, yl, yr;
    interior(ow, sw, pl, kw, dw, w, &xl, &xr);
    interior(oh, sh, pt, kh, dh, h, &yl, &yr);

    for (int64_t b = 0; b < n; b++) {
        const float *ib = in + b * h * w * c;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            float *orow = out + ((b * oh + oy) * ow) * cout;
            int64_t fast_end = 0;
            if (nb <= 2 && oy >= yl && oy < yr) {
                /* interior pixels 4 at a time; the rest below, one at a time */
                for (int64_t ox = xl; ox + 4 <= xr; ox += 4) {
                    if (nb == 1)
                        direct_multi(ib, orow + ox * cout, p, filt, blk, bias, lo, hi, iy0,
                                     ox * sw - pl, 4, 1);
                    else
                        direct_multi(ib, orow + ox * cout, p, filt, blk, bias, lo, hi, iy0,
                                     ox * sw - pl, 4, 2);
                    fast_end = ox + 4;
                }
            }
            for (int64_t ox = 0; ox < ow; ox++) {
                if (ox == xl && fast_end > xl)
                    ox = fast_end;
                if (ox >= ow)
                    break;
                const int64_t ix0 = ox * sw - pl;
                float *op = orow + ox * cout;
                int64_t cb = 0;
                for (; cb + 4 <= nb; cb += 4)
                    direct_pixel(ib, op, p, filt + cb * blk, blk, bias, lo, hi, iy0, ix0, 4, cb);
                switch (nb - cb) {
                case 3: direct_pixel(ib, op, p, filt + cb * blk, blk, bias, lo, hi, iy0, ix0, 3, cb);
                    break;
                case 2: direct_pixel(ib, op, p, filt + cb * blk, blk, bias, lo, hi, iy0, ix0, 2, cb);
                    break;
                case 1: direct_pixel(ib, op, p, filt + cb * blk, blk, bias, lo, hi, iy0, ix0, 1, cb);
                    break;
                default:
                    break;
                }
            }
        }
    }
}

/* ---- 8-bit depthwise convolution ---------------------------------------------------------
 * int32 accumulation of (x - input zero point) * (centred filter), then the reference
 * requantisation (MultiplyByQuantizedMultiplier: a saturating rounding doubling high multiply
 * and a rounding divide by a power of two, as nnhal.ops.common does in int64), plus the output
 * zero point and the activation clamp. q = {input zp, output zp, lo, hi, input signed,
 * output signed}; mult and shift are per output channel (the caller broadcasts them). */

/* SaturatingRoundingDoublingHighMul for a >= 0 multiplier b: the reference's nudge by
 * 2**30 (1 - 2**30 for a negative product) and division truncating toward zero equal
 * floor((a*b + 2**30) / 2**31) for either sign, i.e. an arithmetic shift: branch-free (the
 * sign of the product is unpredictable; branches on it cost more than the arithmetic). The
 * saturating case a == b == INT32_MIN cannot occur with b >= 0. */
static inline int64_t srdhm64(int64_t a, int64_t b)
{
    return (a * b + (INT64_C(1) << 30)) >> 31;
}

/* RoundingDivideByPOT: divide by 2**e rounding half away from zero. */
static inline int64_t rdbp64(int64_t x, int64_t e)
{
    const int64_t mask = (INT64_C(1) << e) - 1;
    const int64_t rem = x & mask;
    const int64_t thr = (mask >> 1) + (x < 0);
    return (x >> e) + (rem > thr);
}

/* The int32 value of x modulo 2**32: the reference keeps sum + bias in an int32 accumulator
 * and shifts it left as an int32 product, both wrapping (nnhal.ops.common.wrap32). The
 * conversion of an out-of-range value to int32_t is modular with the compilers used here. */
static inline int64_t wrap32(int64_t x)
{
    return (int32_t)(uint32_t)(uint64_t)x;
}

/* x: sum + bias, exact in int64 (|x| < 2**33, so the left shift of up to 24 cannot leave
 * int64); wrapping after the shift equals wrapping before and after it. */
static inline int64_t requant(int64_t x, int64_t m, int64_t left, int64_t right)
{
    x = wrap32(x * (INT64_C(1) << left));
    return rdbp64(srdhm64(x, m), right);
}

/* The int32 sums of one output pixel of an 8-bit depthwise convolution, every channel, taps
 * clipped to the input: acc[co] = sum over taps of (x - zin) * centred filter. */
static inline void dw_q8_acc(const void *in_, const int64_t *p, const int32_t *filt,
                             int32_t zin, int sin, int64_t b, int64_t iy0, int64_t ix0,
                             int32_t *acc)
{
    const int64_t h = p[P_H], w = p[P_W], c = p[P_C], cout = p[P_COUT];
    const int64_t kh = p[P_KH], kw = p[P_KW], dh = p[P_DH], dw = p[P_DW], m = p[P_MULT];
    const uint8_t *in_u = in_;
    const int8_t *in_s = in_;
    int64_t ky0, ky1, kx0, kx1;
    tap_range(iy0, kh, dh, h, &ky0, &ky1);
    tap_range(ix0, kw, dw, w, &kx0, &kx1);
    memset(acc, 0, (size_t)cout * sizeof *acc);
    for (int64_t ky = ky0; ky < ky1; ky++)
        for (int64_t kx = kx0; kx < kx1; kx++) {
            const int64_t off = ((b * h + iy0 + ky * dh) * w + ix0 + kx * dw) * c;
            const int32_t *f = filt + (ky * kw + kx) * cout;
            if (m == 1 && sin) {
                const int8_t *x = in_s + off;
                for (int64_t co = 0; co < cout; co++)
                    acc[co] += ((int32_t)x[co] - zin) * f[co];
            } else if (m == 1) {
                const uint8_t *x = in_u + off;
                for (int64_t co = 0; co < cout; co++)
                    acc[co] += ((int32_t)x[co] - zin) * f[co];
            } else {
                for (int64_t co = 0; co < cout; co++) {
                    const int32_t v = sin ? in_s[off + co / m] : in_u[off + co / m];
                    acc[co] += (v - zin) * f[co];
                }
            }
        }
}

void nnhal_dwconv_q8(const void *in_, void *out_, const int64_t *p, const int32_t *filt,
                     const int32_t *bias, const int32_t *mult, const int32_t *shift,
                     const int64_t *q, int32_t *acc)
{
    const int64_t n = p[P_N], oh = p[P_OH], ow = p[P_OW], cout = p[P_COUT];
    const int64_t sh = p[P_SH], sw = p[P_SW], pt = p[P_PT], pl = p[P_PL];
    const int32_t zin = (int32_t)q[0];
    const int64_t zout = q[1], lo = q[2], hi = q[3];
    const int sin = (int)q[4], sout = (int)q[5];

    for (int64_t b = 0; b < n; b++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                dw_q8_acc(in_, p, filt, zin, sin, b, oy * sh - pt, ox * sw - pl, acc);
                const int64_t o = ((b * oh + oy) * ow + ox) * cout;
                for (int64_t co = 0; co < cout; co++) {
                    const int64_t sh_ = shift[co];
                    const int64_t left = sh_ > 0 ? sh_ : 0, right = sh_ > 0 ? 0 : -sh_;
                    int64_t r = requant((int64_t)acc[co] + bias[co], mult[co], left, right);
                    r += zout;
                    r = r < lo ? lo : r;
                    acc[co] = (int32_t)(r > hi ? hi : r);
                }
                if (sout)
                    for (int64_t co = 0; co < cout; co++)
                        ((int8_t *)out_)[o + co] = (int8_t)acc[co];
                else
                    for (int64_t co = 0; co < cout; co++)
                        ((uint8_t *)out_)[o + co] = (uint8_t)acc[co];
            }
}

typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4d load4d(const double *p)
{
    v4d v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* m ? a : b per lane, m a comparison result (all ones or zero). */
static inline v4d select4d(v4l m, v4d a, v4d b)
{
    return (v4d)((m & (v4l)a) | (~m & (v4l)b));
}

typedef int32_t v8i __attribute__((vector_size(32)));

/* The float64 route on 4 channels (see nnhal_dwconv_q8f): the bytes to store. */
static inline __attribute__((always_inline)) void
route4(v4i ai, const double *scale, const double *offset, const double *thr,
       const double *post, v4d lo4, v4d hi4, uint32_t off, uint8_t *o)
{
    const v4d one4 = {1.0, 1.0, 1.0, 1.0};
    const v4d a = __builtin_convertvector(ai, v4d);
    v4d v = a * load4d(scale) + load4d(offset);
    if (thr) {
        const v4l neg = a < load4d(thr);
        v = (v - (v4d)(neg & (v4l)one4)) * load4d(post);
    }
    v = select4d(v < lo4, lo4, v);
    v = select4d(v > hi4, hi4, v);
    const v4i r = __builtin_convertvector(v, v4i) + (int32_t)off;
#ifdef __AVX2__
    const int32_t bytes = _mm_cvtsi128_si32(
        _mm_shuffle_epi8((__m128i)r, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                                   -1, -1, -1, -1)));
    memcpy(o, &bytes, sizeof bytes);
#else
    for (int k = 0; k < 4; k++)
        o[k] = (uint8_t)r[k];
#endif
}

/* 8 bytes widened to int32 (signed or unsigned); gcc's own widening of a byte vector goes
 * through scalar inserts, so the AVX2 instruction is named where it exists. */
static inline v8i load8x(const void *p, int sin)
{
#ifdef __AVX2__
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return (v8i)(sin ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#else
    v8i r;
    for (int k = 0; k < 8; k++)
        r[k] = sin ? ((const int8_t *)p)[k] : ((const uint8_t *)p)[k];
    return r;
#endif
}

/* One output pixel, depth multiplier 1, channels 8 at a time: the sums stay in registers
 * over the taps and go straight through the route (no accumulator array). Returns the number
 * of channels done (a multiple of 8); the caller does the rest. */
static inline __attribute__((always_inline)) int64_t
dw_q8f_pixel8(const uint8_t *ib, const int64_t *p, const int32_t *filt, v8i zin8, int sin,
              int64_t iy0, int64_t ix0, const double *scale, const double *offset,
              const double *thr, const double *post, v4d lo4, v4d hi4, uint32_t off,
              uint8_t *o)
{
    const int64_t w = p[P_W], c = p[P_C], kw = p[P_KW], dh = p[P_DH], dw = p[P_DW];
    const int64_t cv = (c / 8) * 8;
    int64_t ky0, ky1, kx0, kx1;
    tap_range(iy0, p[P_KH], dh, p[P_H], &ky0, &ky1);
    tap_range(ix0, kw, dw, w, &kx0, &kx1);
    for (int64_t co = 0; co < cv; co += 8) {
        v8i acc = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t ky = ky0; ky < ky1; ky++) {
            const uint8_t *irow = ib + ((iy0 + ky * dh) * w + ix0) * c + co;
            const int32_t *frow = filt + ky * kw * c + co;
            for (int64_t kx = kx0; kx < kx1; kx++) {
                v8i f;
                memcpy(&f, frow + kx * c, sizeof f);
                acc += (load8x(irow + kx * dw * c, sin) - zin8) * f;
            }
        }
        v4i a0, a1;
        memcpy(&a0, &acc, sizeof a0);
        memcpy(&a1, (const char *)&acc + sizeof a0, sizeof a1);
        route4(a0, scale + co, offset + co, thr ? thr + co : 0, post ? post + co : 0,
               lo4, hi4, off, o + co);
        route4(a1, scale + co + 4, offset + co + 4, thr ? thr + co + 4 : 0,
               post ? post + co + 4 : 0, lo4, hi4, off, o + co + 4);
    }
    return cv;
}

/* Output row oy of image b, depth multiplier 1, 3x3 taps, unit dilation, every tap inside the
 * input for the pixels [xl, xr): per 8-channel block the nine filter vectors stay in
 * registers across the row. */
static inline __attribute__((always_inline)) void
dw_q8f_row3x3(const uint8_t *ib, const int64_t *p, const int32_t *filt, v8i zin8, int sin,
              int64_t iy0, int64_t xl, int64_t xr, const double *scale, const double *offset,
              const double *thr, const double *post, v4d lo4, v4d hi4, uint32_t off,
              uint8_t *orow)
{
    const int64_t w = p[P_W], c = p[P_C], sw = p[P_SW], pl = p[P_PL];
    const uint8_t *r0 = ib + iy0 * w * c, *r1 = r0 + w * c, *r2 = r1 + w * c;
    for (int64_t co = 0; co < c; co += 8) {
        v8i f[9];
        for (int k = 0; k < 9; k++)
            memcpy(&f[k], filt + k * c + co, sizeof f[k]);
        for (int64_t ox = xl; ox < xr; ox++) {
            const int64_t o = (ox * sw - pl) * c + co;
            v8i acc = (load8x(r0 + o, sin) - zin8) * f[0];
            acc += (load8x(r0 + o + c, sin) - zin8) * f[1];
            acc += (load8x(r0 + o + 2 * c, sin) - zin8) * f[2];
            acc += (load8x(r1 + o, sin) - zin8) * f[3];
            acc += (load8x(r1 + o + c, sin) - zin8) * f[4];
            acc += (load8x(r1 + o + 2 * c, sin) - zin8) * f[5];
            acc += (load8x(r2 + o, sin) - zin8) * f[6];
            acc += (load8x(r2 + o + c, sin) - zin8) * f[7];
            acc += (load8x(r2 + o + 2 * c, sin) - zin8) * f[8];
            v4i a0, a1;
            memcpy(&a0, &acc, sizeof a0);
            memcpy(&a1, (const char *)&acc + sizeof a0, sizeof a1);
            uint8_t *op = orow + ox * c + co;
            route4(a0, scale + co, offset + co, thr ? thr + co : 0, post ? post + co : 0,
                   lo4, hi4, off, op);
            route4(a1, scale + co + 4, offset + co + 4, thr ? thr + co + 4 : 0,
                   post ? post + co + 4 : 0, lo4, hi4, off, op + 4);
        }
    }
}

/* Depth multiplier 1: every pixel through dw_q8f_pixel8, except the interior of 3x3 rows
 * (dw_q8f_row3x3) when the channels are a multiple of 8. Returns 0 when the channels are not
 * a multiple of 8 (nothing done; the caller takes the general loop). */
static inline __attribute__((always_inline)) int
dw_q8f_m1(const void *in_, void *out_, const int64_t *p, const int32_t *filt, v8i zin8,
          int sin, const double *scale, const double *offset, const double *thr,
          const double *post, v4d lo4, v4d hi4, uint32_t off)
{
    const int64_t n = p[P_N], h = p[P_H], w = p[P_W], c = p[P_C];
    const int64_t oh = p[P_OH], ow = p[P_OW];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL];
    if (c % 8 != 0 || p[P_MULT] != 1)
        return 0;
    const int fast = kh == 3 && kw == 3 && dh == 1 && dw == 1;
    int64_t xl, xr, yl, yr;
    interior(ow, sw, pl, kw, dw, w, &xl, &xr);
    interior(oh, sh, pt, kh, dh, h, &yl, &yr);
    for (int64_t b = 0; b < n; b++) {
        const uint8_t *ib = (const uint8_t *)in_ + b * h * w * c;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            uint8_t *orow = (uint8_t *)out_ + ((b * oh + oy) * ow) * c;
            const int row_fast = fast && oy >= yl && oy < yr;
            for (int64_t ox = 0; ox < ow; ox++) {
                if (row_fast && ox == xl && xr > xl)
                    ox = xr;
                if (ox >= ow)
                    break;
                dw_q8f_pixel8(ib, p, filt, zin8, sin, iy0, ox * sw - pl, scale, offset, thr,
                              post, lo4, hi4, off, orow + ox * c);
            }
            if (row_fast && xr > xl)
                dw_q8f_row3x3(ib, p, filt, zin8, sin, iy0, xl, xr, scale, offset, thr, post,
                              lo4, hi4, off, orow);
        }
    }
    return 1;
}

/* The same convolution requantised by the float64 route of nnhal.ops.conv_engine's
 * Requantizer (see its docstring for why it is exact where the caller selects it): per
 * output channel w = acc * scale + offset, with a threshold table
 * w = (w - [acc < threshold]) * post, then clamp to [lo, hi] (lo >= 0) and truncate, and add
 * `off` modulo 256 to the byte. Each operation is one IEEE double rounding in the same order
 * as numpy's passes (no FMA contraction: -ffp-contract=off), so the bytes are identical.
 * rt = {scale, offset, threshold, post} each [COUT] (threshold and post NULL without the
 * correction); q = {input zp, input signed, off}; lohi = {lo, hi}. */
void nnhal_dwconv_q8f(const void *in_, void *out_, const int64_t *p, const int32_t *filt,
                      const double *scale, const double *offset, const double *thr,
                      const double *post, const int64_t *q, const double *lohi, int32_t *acc)
{
    const int64_t n = p[P_N], oh = p[P_OH], ow = p[P_OW], cout = p[P_COUT];
    const int64_t sh = p[P_SH], sw = p[P_SW], pt = p[P_PT], pl = p[P_PL];
    const int32_t zin = (int32_t)q[0];
    const int sin = (int)q[1];
    const uint32_t off = (uint32_t)q[2];
    const double lo = lohi[0], hi = lohi[1];
    const v4d lo4 = {lo, lo, lo, lo}, hi4 = {hi, hi, hi, hi}, one4 = {1.0, 1.0, 1.0, 1.0};
    uint8_t *out = out_;

    const v8i zin8 = {zin, zin, zin, zin, zin, zin, zin, zin};
    const int64_t h = p[P_H], w = p[P_W], c = p[P_C];

    if (sin && thr) {
        if (dw_q8f_m1(in_, out_, p, filt, zin8, 1, scale, offset, thr, post, lo4, hi4, off))
            return;
    } else if (sin) {
        if (dw_q8f_m1(in_, out_, p, filt, zin8, 1, scale, offset, 0, 0, lo4, hi4, off))
            return;
    } else if (thr) {
        if (dw_q8f_m1(in_, out_, p, filt, zin8, 0, scale, offset, thr, post, lo4, hi4, off))
            return;
    } else if (dw_q8f_m1(in_, out_, p, filt, zin8, 0, scale, offset, 0, 0, lo4, hi4, off)) {
        return;
    }

    for (int64_t b = 0; b < n; b++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                uint8_t *o = out + ((b * oh + oy) * ow + ox) * cout;
                int64_t done = 0;
                if (p[P_MULT] == 1) {
                    const uint8_t *ib = (const uint8_t *)in_ + b * h * w * c;
                    if (sin && thr)
                        done = dw_q8f_pixel8(ib, p, filt, zin8, 1, oy * sh - pt, ox * sw - pl,
                                             scale, offset, thr, post, lo4, hi4, off, o);
                    else if (sin)
                        done = dw_q8f_pixel8(ib, p, filt, zin8, 1, oy * sh - pt, ox * sw - pl,
                                             scale, offset, 0, 0, lo4, hi4, off, o);
                    else if (thr)
                        done = dw_q8f_pixel8(ib, p, filt, zin8, 0, oy * sh - pt, ox * sw - pl,
                                             scale, offset, thr, post, lo4, hi4, off, o);
                    else
                        done = dw_q8f_pixel8(ib, p, filt, zin8, 0, oy * sh - pt, ox * sw - pl,
                                             scale, offset, 0, 0, lo4, hi4, off, o);
                    if (done == cout)
                        continue;
                }
                dw_q8_acc(in_, p, filt, zin, sin, b, oy * sh - pt, ox * sw - pl, acc);
                if (thr) {
                    int64_t co = done;
                    for (; co + 4 <= cout; co += 4) {
                        v4i ai;
                        memcpy(&ai, acc + co, sizeof ai);
                        const v4d a = __builtin_convertvector(ai, v4d);
                        v4d v = a * load4d(scale + co) + load4d(offset + co);
                        const v4l neg = a < load4d(thr + co);
                        v = (v - (v4d)(neg & (v4l)one4)) * load4d(post + co);
                        v = select4d(v < lo4, lo4, v);
                        v = select4d(v > hi4, hi4, v);
                        const v4i r = __builtin_convertvector(v, v4i);
                        for (int k = 0; k < 4; k++)
                            o[co + k] = (uint8_t)((uint32_t)r[k] + off);
                    }
                    for (; co < cout; co++) {
                        const double a = (double)acc[co];
                        double v = a * scale[co] + offset[co];
                        v = (v - (a < thr[co] ? 1.0 : 0.0)) * post[co];
                        v = v < lo ? lo : v;
                        v = v > hi ? hi : v;
                        o[co] = (uint8_t)((uint32_t)(int32_t)v + off);
                    }
                } else {
                    for (int64_t co = done; co < cout; co++) {
                        double v = (double)acc[co] * scale[co] + offset[co];
                        v = v < lo ? lo : v;
                        v = v > hi ? hi : v;
                        o[co] = (uint8_t)((uint32_t)(int32_t)v + off);
                    }
                }
            }
}

/* ---- 8-bit convolution (one group) as an int8 GEMM -------------------------------------------
 * out[m][co] = requant(sum_k a[m][k] * f[k][co] + corr[co]) over the patch matrix a of the
 * input. Bytes of a are unsigned: the input itself (uint8) or the input + 128 (int8, a flip of
 * the top bit), and za (the input zero point in those units) where a tap falls in the padding,
 * so every term of the reference's sum (x - zin) * f becomes a * f - za * f; the caller folds
 * -za * sum_k f and the bias into corr (int64). The filter is signed bytes (the caller checks
 * it fits), packed as panels of NR output channels: [COUTP / NR][KP / 4][NR][4] (zero-padded
 * to KP, a multiple of 4, and COUTP, a multiple of NR), the layout of a 4-way byte dot product
 * (AVX-512 VNNI's vpdpbusd: u8 x s8, sums of four products added to int32 lanes with no
 * intermediate saturation, so exact). Sums are exact in int32: the caller checks
 * KP * 255 * 128 < 2**31. The requantisation is the reference's int64 fixed-point steps
 * (requant above), 8 channels at a time, or, where corr32 and rq32 are given (q8_rq16's
 * conditions, checked by the caller), 16 at a time in int32 lanes. With AVX2 but not VNNI,
 * the rows widened to uint16 and AVX2's int16 multiply-add (q8_micro; abuf then holds
 * 3 * Q8_MR * KP bytes), and the int32 requantisation 8 channels at a time. Without either,
 * the same loops in plain C (exact, slower; nnhal_conv_q8_isa says which was compiled).
 * q = {za, zout, lo, hi, input signed, KP, COUTP}. */

#define Q8_MR 6
#define Q8_NR 32

/* Which vector kernels were compiled, as bits: 1 the 16-lane 8-bit depthwise kernel
 * (AVX-512 or AVX2), 2 a vector GEMM (AVX2 or AVX-512 VNNI), 4 the GEMM is AVX-512 VNNI's
 * byte dot product (else, with 2, AVX2's int16 multiply-add). */
int64_t nnhal_conv_q8_isa(void)
{
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 1 | 2 | 4;
#elif defined(__AVX512F__)
    return 1 | 2;
#elif defined(__AVX2__)
    return 1 | 2;
#else
    return 0;
#endif
}

/* dst[k] = src[k] ^ flip for k < n. */
static inline void q8_copy_flip(uint8_t *dst, const uint8_t *src, int64_t n, uint8_t flip)
{
    int64_t k = 0;
#ifdef __AVX2__
    const __m256i f32 = _mm256_set1_epi8((char)flip);
    for (; k + 32 <= n; k += 32)
        _mm256_storeu_si256((__m256i *)(dst + k), _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(src + k)), f32));
    const __m128i f16 = _mm_set1_epi8((char)flip);
    for (; k + 16 <= n; k += 16)
        _mm_storeu_si128((__m128i *)(dst + k), _mm_xor_si128(
            _mm_loadu_si128((const __m128i *)(src + k)), f16));
#endif
    for (; k < n; k++)
        dst[k] = src[k] ^ flip;
}

/* dst[k] = src[k] as uint16, for k < n (a multiple of 4: Q8_MR * KP). */
static inline void q8_widen(const uint8_t *src, uint16_t *dst, int64_t n)
{
    int64_t k = 0;
#ifdef __AVX2__
    for (; k + 16 <= n; k += 16)
        _mm256_storeu_si256((__m256i *)(dst + k),
                            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(src + k))));
#endif
    for (; k < n; k++)
        dst[k] = src[k];
}

/* The patch-matrix rows of Q8_MR output pixels starting at pixel m0 (rows past mend repeat
 * za; their results are discarded). */
static void q8_pack_rows(const uint8_t *in, const int64_t *p, int64_t m0, int64_t mend,
                         uint8_t za, int sin, int64_t kp, uint8_t *abuf)
{
    const int64_t h = p[P_H], w = p[P_W], c = p[P_C], oh = p[P_OH], ow = p[P_OW];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL];
    const uint8_t flip = sin ? 0x80 : 0;
    if (kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && h == oh && w == ow
        && kp == c && m0 + Q8_MR <= mend) {
        /* a 1x1 convolution of stride 1: the rows are the input's pixels, one span */
        q8_copy_flip(abuf, in + m0 * c, Q8_MR * c, flip);
        return;
    }
    int64_t b = m0 / (oh * ow), r = m0 % (oh * ow), oy = r / ow, ox = r % ow;
    for (int64_t i = 0; i < Q8_MR; i++, ox++) {
        if (ox == ow) {
            ox = 0;
            if (++oy == oh) {
                oy = 0;
                b++;
            }
        }
        uint8_t *row = abuf + i * kp;
        const int64_t m = m0 + i;
        if (m >= mend) {
            memset(row, za, (size_t)kp);
            continue;
        }
        const int64_t iy0 = oy * sh - pt, ix0 = ox * sw - pl;
        uint8_t *dst = row;
        for (int64_t ky = 0; ky < kh; ky++) {
            const int64_t iy = iy0 + ky * dh;
            for (int64_t kx = 0; kx < kw; kx++, dst += c) {
                const int64_t ix = ix0 + kx * dw;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                    memset(dst, za, (size_t)c);
                    continue;
                }
                q8_copy_flip(dst, in + ((b * h + iy) * w + ix) * c, c, flip);
            }
        }
        memset(dst, 0, (size_t)(kp - kh * kw * c)); /* K padding: the filter is zero there */
    }
}

#if defined(__AVX2__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
/* q8_micro's AVX2 loop for 3 rows widened to uint16 (a0, kp apart). Per 4 channels of the
 * panel, the 16 filter bytes (4 taps each) widened to int16 and multiplied by the row's 4 taps
 * broadcast: vpmaddwd adds products pairwise into int32 (exact: |a * f| < 2**15 * 2**8), so
 * each channel keeps two partial sums (taps 0+1 and 2+3), added at the end. */
static inline __attribute__((always_inline)) void
q8_micro3(const uint16_t *a0, int64_t kp, const int8_t *panel, int32_t *acc, int64_t ldc)
{
    const uint16_t *a1 = a0 + kp, *a2 = a1 + kp;
    for (int64_t j = 0; j < Q8_NR; j += 8) {
        __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
                c21 = c00;
        const int8_t *fp = panel + j * 4;
        for (int64_t k = 0; k < kp; k += 4, fp += Q8_NR * 4) {
            const __m256i f0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)fp));
            const __m256i f1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(fp + 16)));
            int64_t v;
            __m256i a;
#define Q8_ROW(ci0, ci1, ai) \
            memcpy(&v, ai + k, 8); a = _mm256_set1_epi64x(v); \
            ci0 = _mm256_add_epi32(ci0, _mm256_madd_epi16(a, f0)); \
            ci1 = _mm256_add_epi32(ci1, _mm256_madd_epi16(a, f1));
            Q8_ROW(c00, c01, a0) Q8_ROW(c10, c11, a1) Q8_ROW(c20, c21, a2)
#undef Q8_ROW
        }
        /* lanes {c0 s01, c0 s23, c1 .., c1 .., c2, .., c3 ..} and the same for c4..c7: the
         * pairwise add gives {c0 c1 c4 c5 | c2 c3 c6 c7}, the permute puts them in order */
#define Q8_OUT(ci0, ci1, i) _mm256_storeu_si256((__m256i *)(acc + (i) * ldc + j), \
            _mm256_permute4x64_epi64(_mm256_hadd_epi32(ci0, ci1), 0xD8));
        Q8_OUT(c00, c01, 0) Q8_OUT(c10, c11, 1) Q8_OUT(c20, c21, 2)
#undef Q8_OUT
    }
}
#endif

/* acc[i][j] (ldc int32 apart) = sum over KP of the Q8_MR rows of abuf and the NR channels of
 * one filter panel. */
static void q8_micro(const uint8_t *abuf, int64_t kp, const int8_t *panel, int32_t *acc,
                     int64_t ldc)
{
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
            c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const uint8_t *a0 = abuf, *a1 = a0 + kp, *a2 = a1 + kp, *a3 = a2 + kp, *a4 = a3 + kp,
                  *a5 = a4 + kp;
    for (int64_t k = 0; k < kp; k += 4) {
        const __m512i b0 = _mm512_loadu_si512((const void *)(panel + k * Q8_NR));
        const __m512i b1 = _mm512_loadu_si512((const void *)(panel + k * Q8_NR + 64));
        int32_t v;
        __m512i a;
        memcpy(&v, a0 + k, 4); a = _mm512_set1_epi32(v);
        c00 = _mm512_dpbusd_epi32(c00, a, b0); c01 = _mm512_dpbusd_epi32(c01, a, b1);
        memcpy(&v, a1 + k, 4); a = _mm512_set1_epi32(v);
        c10 = _mm512_dpbusd_epi32(c10, a, b0); c11 = _mm512_dpbusd_epi32(c11, a, b1);
        memcpy(&v, a2 + k, 4); a = _mm512_set1_epi32(v);
        c20 = _mm512_dpbusd_epi32(c20, a, b0); c21 = _mm512_dpbusd_epi32(c21, a, b1);
        memcpy(&v, a3 + k, 4); a = _mm512_set1_epi32(v);
        c30 = _mm512_dpbusd_epi32(c30, a, b0); c31 = _mm512_dpbusd_epi32(c31, a, b1);
        memcpy(&v, a4 + k, 4); a = _mm512_set1_epi32(v);
        c40 = _mm512_dpbusd_epi32(c40, a, b0); c41 = _mm512_dpbusd_epi32(c41, a, b1);
        memcpy(&v, a5 + k, 4); a = _mm512_set1_epi32(v);
        c50 = _mm512_dpbusd_epi32(c50, a, b0); c51 = _mm512_dpbusd_epi32(c51, a, b1);
    }
    _mm512_storeu_si512((void *)(acc + 0 * ldc), c00);
    _mm512_storeu_si512((void *)(acc + 0 * ldc + 16), c01);
    _mm512_storeu_si512((void *)(acc + 1 * ldc), c10);
    _mm512_storeu_si512((void *)(acc + 1 * ldc + 16), c11);
    _mm512_storeu_si512((void *)(acc + 2 * ldc), c20);
    _mm512_storeu_si512((void *)(acc + 2 * ldc + 16), c21);
    _mm512_storeu_si512((void *)(acc + 3 * ldc), c30);
    _mm512_storeu_si512((void *)(acc + 3 * ldc + 16), c31);
    _mm512_storeu_si512((void *)(acc + 4 * ldc), c40);
    _mm512_storeu_si512((void *)(acc + 4 * ldc + 16), c41);
    _mm512_storeu_si512((void *)(acc + 5 * ldc), c50);
    _mm512_storeu_si512((void *)(acc + 5 * ldc + 16), c51);
#elif defined(__AVX2__)
    /* abuf here is the rows widened to uint16 (q8_widen): two passes of 3 rows each
     * (q8_micro3), so the 6 accumulators, 2 filter vectors and the broadcast row stay in
     * AVX2's 16 registers (6 rows at once spilled accumulators to the stack every step). */
    const uint16_t *a = (const uint16_t *)abuf;
    q8_micro3(a, kp, panel, acc, ldc);
    q8_micro3(a + 3 * kp, kp, panel, acc + 3 * ldc, ldc);
#else
    for (int64_t i = 0; i < Q8_MR; i++) {
        int32_t s[Q8_NR] = {0};
        const uint8_t *a = abuf + i * kp;
        for (int64_t k = 0; k < kp; k += 4)
            for (int j = 0; j < Q8_NR; j++) {
                const int8_t *f = panel + k * Q8_NR + j * 4;
                s[j] += a[k] * f[0] + a[k + 1] * f[1] + a[k + 2] * f[2] + a[k + 3] * f[3];
            }
        memcpy(acc + i * ldc, s, sizeof s);
    }
#endif
}

#ifdef __AVX512F__
/* Constants of the vectorised requantisation. */
typedef struct {
    __m512i lo, hi, zout, nudge, one, zero, lo32, hi32, zout32, one32;
    /* the int32 requantisation (q8_rq16) where use32: its tables and the int32 bias */
    int use32;
    const int32_t *rq32, *bias32;
} q8_consts;

static inline q8_consts q8_make_consts(int64_t zout, int64_t lo, int64_t hi)
{
    q8_consts k = {_mm512_set1_epi64(lo), _mm512_set1_epi64(hi), _mm512_set1_epi64(zout),
                   _mm512_set1_epi64(1 << 30), _mm512_set1_epi64(1), _mm512_setzero_si512(),
                   _mm512_set1_epi32((int32_t)lo), _mm512_set1_epi32((int32_t)hi),
                   _mm512_set1_epi32((int32_t)zout), _mm512_set1_epi32(1), 0, 0, 0};
    return k;
}

/* The reference requantisation of 8 channels (a: int32 sums of channels co..co+7): the int64
 * steps of requant() above, lane by lane, and the 8 result bytes in the low half. */
static inline __m128i q8_rq8(__m256i a, const int64_t *corr, const int64_t *rq, int64_t ld,
                             int64_t co, const q8_consts *k)
{
    __m512i x = _mm512_add_epi64(_mm512_cvtepi32_epi64(a),
                                 _mm512_loadu_si512((const void *)(corr + co)));
    x = _mm512_sllv_epi64(x, _mm512_loadu_si512((const void *)(rq + ld + co)));
    x = _mm512_srai_epi64(_mm512_slli_epi64(x, 32), 32); /* wrap32: two one-uop shifts */
    /* x and the multiplier are int32: the signed 32 x 32 -> 64 product is exact */
    __m512i y = _mm512_mul_epi32(x, _mm512_loadu_si512((const void *)(rq + co)));
    y = _mm512_srai_epi64(_mm512_add_epi64(y, k->nudge), 31);
    const __m512i rem = _mm512_and_si512(y, _mm512_loadu_si512((const void *)(rq + 3 * ld + co)));
    const __m512i half = _mm512_loadu_si512((const void *)(rq + 4 * ld + co));
    const __m512i thr = _mm512_mask_add_epi64(half, _mm512_cmplt_epi64_mask(y, k->zero), half,
                                              k->one);
    __m512i r = _mm512_srav_epi64(y, _mm512_loadu_si512((const void *)(rq + 2 * ld + co)));
    r = _mm512_mask_add_epi64(r, _mm512_cmpgt_epi64_mask(rem, thr), r, k->one);
    r = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(r, k->zout), k->lo), k->hi);
    return _mm512_cvtepi64_epi8(r);
}

/* Per-channel tables of q8_rq16 for 16 channels. */
typedef struct {
    __m512i mult, mult_odd, right, mask, half;
} q8_tab16;

/* rq32 = {multiplier, right shift, 2**right - 1, (2**right - 1) >> 1}, each [ld] int32. */
static inline q8_tab16 q8_load_tab16(const int32_t *rq32, int64_t ld, int64_t co)
{
    q8_tab16 t;
    t.mult = _mm512_loadu_si512((const void *)(rq32 + co));
    t.mult_odd = _mm512_srli_epi64(t.mult, 32);
    t.right = _mm512_loadu_si512((const void *)(rq32 + ld + co));
    t.mask = _mm512_loadu_si512((const void *)(rq32 + 2 * ld + co));
    t.half = _mm512_loadu_si512((const void *)(rq32 + 3 * ld + co));
    return t;
}

/* The reference requantisation of 16 channels in int32 lanes, for x = sum + bias already in
 * int32 (no left shift, right shifts up to 30: the caller checks both and that x cannot leave
 * int32): the doubling high multiply's 64-bit products on even and odd lanes apart, then the
 * rounding divide, the zero point and the clamp; the 16 result bytes. */
static inline __m128i q8_rq16(__m512i x, const q8_tab16 *t, const q8_consts *k)
{
    __m512i pe = _mm512_mul_epi32(x, t->mult);
    __m512i po = _mm512_mul_epi32(_mm512_srli_epi64(x, 32), t->mult_odd);
    pe = _mm512_srai_epi64(_mm512_add_epi64(pe, k->nudge), 31);
    po = _mm512_srai_epi64(_mm512_add_epi64(po, k->nudge), 31);
    const __m512i y = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
    const __m512i one = k->one32;
    const __m512i rem = _mm512_and_si512(y, t->mask);
    const __m512i thr = _mm512_mask_add_epi32(t->half, _mm512_cmplt_epi32_mask(y, k->zero),
                                              t->half, one);
    __m512i r = _mm512_srav_epi32(y, t->right);
    r = _mm512_mask_add_epi32(r, _mm512_cmpgt_epi32_mask(rem, thr), r, one);
    r = _mm512_add_epi32(r, k->zout32);
    r = _mm512_min_epi32(_mm512_max_epi32(r, k->lo32), k->hi32);
    return _mm512_cvtepi32_epi8(r);
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* q8_rq16's int32 requantisation on 8 channels (AVX2): x = sum + bias in int32, rq32 as for
 * q8_rq16. AVX2 has no 64-bit arithmetic shift, but (x * m + 2**30) >> 31 fits int32 (|x|,
 * m < 2**31), so its low 32 bits are those of the logical shift (even lanes) and the high 32
 * of a left shift by 1 (odd lanes). Returns the 8 result bytes in the low half. */
/* q8_rq8x32's per-channel tables for 8 channels (loaded once for all the pixels that use
 * them: the byte stores between uses may alias them, so the compiler could not hoist them). */
typedef struct {
    __m256i mult, mult_odd, right, mask, half;
} q8_tab8;

static inline q8_tab8 q8_load_tab8(const int32_t *rq32, int64_t ld, int64_t co)
{
    q8_tab8 t;
    t.mult = _mm256_loadu_si256((const __m256i *)(rq32 + co));
    t.mult_odd = _mm256_srli_epi64(t.mult, 32);
    t.right = _mm256_loadu_si256((const __m256i *)(rq32 + ld + co));
    t.mask = _mm256_loadu_si256((const __m256i *)(rq32 + 2 * ld + co));
    t.half = _mm256_loadu_si256((const __m256i *)(rq32 + 3 * ld + co));
    return t;
}

/* q8_rq8x32 with its tables given: the 8 results as int32 lanes, already clamped to
 * [lo, hi] (so within the output type's range). */
static inline __m256i q8_rq8x32t(__m256i x, const q8_tab8 *t, __m256i zout, __m256i lo,
                                 __m256i hi)
{
    const __m256i nudge = _mm256_set1_epi64x(INT64_C(1) << 30);
    const __m256i pe = _mm256_add_epi64(_mm256_mul_epi32(x, t->mult), nudge);
    const __m256i po = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(x, 32),
                                                         t->mult_odd), nudge);
    const __m256i y = _mm256_blend_epi32(_mm256_srli_epi64(pe, 31), _mm256_slli_epi64(po, 1),
                                         0xAA);
    /* thr = half + (y < 0); rem > thr adds one: the comparisons give -1 for true */
    const __m256i thr = _mm256_sub_epi32(t->half,
                                         _mm256_cmpgt_epi32(_mm256_setzero_si256(), y));
    __m256i r = _mm256_srav_epi32(y, t->right);
    r = _mm256_sub_epi32(r, _mm256_cmpgt_epi32(_mm256_and_si256(y, t->mask), thr));
    r = _mm256_add_epi32(r, zout);
    return _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
}

/* The low byte of each of the 8 int32 lanes (either signedness), in the low 8 bytes. */
static inline __m128i q8_bytes8(__m256i r)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, -1, -1);
    const __m256i b = _mm256_shuffle_epi8(r, pick);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

static inline __m128i q8_rq8x32(__m256i x, const int32_t *rq32, int64_t ld, int64_t co,
                                int32_t zout, int32_t lo, int32_t hi)
{
    const q8_tab8 t = q8_load_tab8(rq32, ld, co);
    return q8_bytes8(q8_rq8x32t(x, &t, _mm256_set1_epi32(zout), _mm256_set1_epi32(lo),
                                _mm256_set1_epi32(hi)));
}
#endif

/* One output pixel's cout results: the reference requantisation of a + corr, per channel with
 * rq = {multiplier, left shift, right shift, 2**right - 1, (2**right - 1) >> 1}, each
 * [ld] int64 (row i of rq at rq + i * ld). */
static inline void q8_requant_row(const int32_t *a, const int64_t *corr, const int64_t *rq,
                                  int64_t cout, int64_t ld, int64_t zout, int64_t lo,
                                  int64_t hi, uint8_t *o, const int32_t *corr32,
                                  const int32_t *rq32)
{
#if !defined(__AVX512F__) && !defined(__AVX2__)
    (void)corr32; (void)rq32;
#endif
    const int64_t *mult = rq, *left = rq + ld, *right = rq + 2 * ld, *mask = rq + 3 * ld,
                  *half = rq + 4 * ld;
    int64_t co = 0;
#ifdef __AVX512F__
    const q8_consts k = q8_make_consts(zout, lo, hi);
    if (corr32) {
        for (; co + 16 <= cout; co += 16) {
            const q8_tab16 t = q8_load_tab16(rq32, ld, co);
            _mm_storeu_si128((__m128i *)(o + co), q8_rq16(_mm512_add_epi32(
                _mm512_loadu_si512((const void *)(a + co)),
                _mm512_loadu_si512((const void *)(corr32 + co))), &t, &k));
        }
    }
    for (; co + 8 <= cout; co += 8)
        _mm_storel_epi64((__m128i *)(o + co),
                         q8_rq8(_mm256_loadu_si256((const __m256i *)(a + co)), corr, rq, ld,
                                co, &k));
#elif defined(__AVX2__)
    if (corr32)
        for (; co + 8 <= cout; co += 8)
            _mm_storel_epi64((__m128i *)(o + co), q8_rq8x32(_mm256_add_epi32(
                _mm256_loadu_si256((const __m256i *)(a + co)),
                _mm256_loadu_si256((const __m256i *)(corr32 + co))), rq32, ld, co,
                (int32_t)zout, (int32_t)lo, (int32_t)hi));
#endif
    for (; co < cout; co++) {
        const int64_t x = wrap32(((int64_t)a[co] + corr[co]) * (INT64_C(1) << left[co]));
        const int64_t y = (x * mult[co] + (INT64_C(1) << 30)) >> 31;
        const int64_t thr = half[co] + (y < 0);
        int64_t r = (y >> right[co]) + ((y & mask[co]) > thr) + zout;
        r = r < lo ? lo : r;
        r = r > hi ? hi : r;
        o[co] = (uint8_t)r;
    }
}

void nnhal_conv_q8(const void *in_, void *out_, const int64_t *p, const int8_t *filt,
                   const int64_t *corr, const int64_t *rq, const int64_t *q, uint8_t *abuf,
                   int32_t *acc, const int32_t *corr32, const int32_t *rq32)
{
    const int64_t cout = p[P_COUT];
    const int64_t mtot = p[P_N] * p[P_OH] * p[P_OW];
    const uint8_t za = (uint8_t)q[0];
    const int64_t zout = q[1], lo = q[2], hi = q[3];
    const int sin = (int)q[4];
    const int64_t kp = q[5], coutp = q[6];
    uint8_t *out = out_;

#if defined(__AVX2__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
    uint8_t *arows = abuf + Q8_MR * kp; /* the rows widened to uint16 (2 * Q8_MR * KP bytes) */
#else
    uint8_t *arows = abuf;
#endif
    for (int64_t m0 = 0; m0 < mtot; m0 += Q8_MR) {
        q8_pack_rows(in_, p, m0, mtot, za, sin, kp, abuf);
        if (arows != abuf)
            q8_widen(abuf, (uint16_t *)arows, Q8_MR * kp);
        for (int64_t j0 = 0; j0 < coutp; j0 += Q8_NR)
            q8_micro(arows, kp, filt + j0 * kp, acc + j0, coutp);
        const int64_t mr = mtot - m0 < Q8_MR ? mtot - m0 : Q8_MR;
#if defined(__AVX2__) && !defined(__AVX512F__)
        if (corr32) {
            /* 8 channels at a time for all the rows: the tables loaded once */
            const __m256i vz = _mm256_set1_epi32((int32_t)zout), vlo = _mm256_set1_epi32(
                (int32_t)lo), vhi = _mm256_set1_epi32((int32_t)hi);
            const int64_t c8 = cout & ~INT64_C(7);
            for (int64_t co = 0; co < c8; co += 8) {
                const q8_tab8 t = q8_load_tab8(rq32, coutp, co);
                const __m256i cv = _mm256_loadu_si256((const __m256i *)(corr32 + co));
                for (int64_t i = 0; i < mr; i++)
                    _mm_storel_epi64((__m128i *)(out + (m0 + i) * cout + co), q8_bytes8(
                        q8_rq8x32t(_mm256_add_epi32(_mm256_loadu_si256(
                            (const __m256i *)(acc + i * coutp + co)), cv), &t, vz, vlo,
                                   vhi)));
            }
            if (c8 < cout)
                for (int64_t i = 0; i < mr; i++)
                    q8_requant_row(acc + i * coutp + c8, corr + c8, rq + c8, cout - c8, coutp,
                                   zout, lo, hi, out + (m0 + i) * cout + c8, 0, 0);
            continue;
        }
#endif
        for (int64_t i = 0; i < mr; i++)
            q8_requant_row(acc + i * coutp, corr, rq, cout, coutp, zout, lo, hi,
                           out + (m0 + i) * cout, corr32, rq32);
    }
}

/* ---- 8-bit depthwise convolution, 16 channels at a time (AVX-512; AVX2 as two halves) -------
 * Depth multiplier 1, channels a multiple of 16. Sums of (x - zin) * f in float32 lanes: every
 * product and partial sum is an integer below 2**24 in magnitude (the caller checks
 * KH * KW * 255 * 255 < 2**24), so each fused multiply-add is exact and the sums equal the
 * int32 ones. Then the reference requantisation (q8_rq8) with corr = the bias (int64) and
 * rq as for nnhal_conv_q8 ([5][C]), or, where bias32 and rq32 are given (the caller checks
 * q8_rq16's conditions), the int32 requantisation. filt is [KH][KW][C] float32 (the centred
 * filter). q = {zin, zout, lo, hi, input signed}; xf is scratch of N*H*W*C float32. Returns 0 (nothing done) where it does not apply:
 * the caller then runs nnhal_dwconv_q8 / nnhal_dwconv_q8f. */
#ifdef __AVX512F__
/* x - zin as float32 (exact), 16 values. */
static inline __m512 dwv_convert(const uint8_t *p, int sin, __m512 zin)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m512i w = sin ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
    return _mm512_sub_ps(_mm512_cvtepi32_ps(w), zin);
}

#define dwv_load(p) _mm512_loadu_ps(p)

static inline void dwv_store(__m512 acc, const int64_t *corr, const int64_t *rq, int64_t c,
                             int64_t co, const q8_consts *k, uint8_t *o)
{
    const __m512i a = _mm512_cvtps_epi32(acc); /* exact: an integer below 2**24 */
    if (k->use32) {
        const q8_tab16 t = q8_load_tab16(k->rq32, c, co);
        _mm_storeu_si128((__m128i *)o, q8_rq16(_mm512_add_epi32(
            a, _mm512_loadu_si512((const void *)(k->bias32 + co))), &t, k));
        return;
    }
    const __m128i lo = q8_rq8(_mm512_castsi512_si256(a), corr, rq, c, co, k);
    const __m128i hi = q8_rq8(_mm512_extracti64x4_epi64(a, 1), corr, rq, c, co + 8, k);
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi64(lo, hi));
}

static inline __attribute__((always_inline)) void
dwv_pixel(const float *ib, const int64_t *p, const float *filt, const int64_t *corr,
          const int64_t *rq, const q8_consts *k, int64_t iy0, int64_t ix0, uint8_t *o)
{
    const int64_t w = p[P_W], c = p[P_C], kw = p[P_KW], dh = p[P_DH], dw = p[P_DW];
    int64_t ky0, ky1, kx0, kx1;
    tap_range(iy0, p[P_KH], dh, p[P_H], &ky0, &ky1);
    tap_range(ix0, kw, dw, w, &kx0, &kx1);
    for (int64_t co = 0; co < c; co += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t ky = ky0; ky < ky1; ky++) {
            const float *irow = ib + ((iy0 + ky * dh) * w + ix0) * c + co;
            const float *frow = filt + ky * kw * c + co;
            for (int64_t kx = kx0; kx < kx1; kx++)
                acc = _mm512_fmadd_ps(dwv_load(irow + kx * dw * c),
                                      _mm512_loadu_ps(frow + kx * c), acc);
        }
        dwv_store(acc, corr, rq, c, co, k, o + co);
    }
}

static inline __attribute__((always_inline)) void
dwv_all(const float *xf, void *out_, const int64_t *p, const float *filt, const int64_t *corr,
        const int64_t *rq, const q8_consts *k)
{
    const int64_t n = p[P_N], h = p[P_H], w = p[P_W], c = p[P_C];
    const int64_t oh = p[P_OH], ow = p[P_OW];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL];
    const int fast = kh == 3 && kw == 3 && dh == 1 && dw == 1;
    int64_t xl, xr, yl, yr;
    interior(ow, sw, pl, kw, dw, w, &xl, &xr);
    interior(oh, sh, pt, kh, dh, h, &yl, &yr);
    for (int64_t b = 0; b < n; b++) {
        const float *ib = xf + b * h * w * c;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            uint8_t *orow = (uint8_t *)out_ + ((b * oh + oy) * ow) * c;
            const int row_fast = fast && oy >= yl && oy < yr && xr > xl;
            for (int64_t ox = 0; ox < ow; ox++) {
                if (row_fast && ox == xl)
                    ox = xr;
                if (ox >= ow)
                    break;
                dwv_pixel(ib, p, filt, corr, rq, k, iy0, ox * sw - pl, orow + ox * c);
            }
            if (!row_fast)
                continue;
            const float *r0 = ib + iy0 * w * c, *r1 = r0 + w * c, *r2 = r1 + w * c;
            for (int64_t co = 0; co < c; co += 16) {
                __m512 f[9];
                for (int t = 0; t < 9; t++)
                    f[t] = _mm512_loadu_ps(filt + t * c + co);
                if (k->use32) {
                    const q8_tab16 tab = q8_load_tab16(k->rq32, c, co);
                    const __m512i bv = _mm512_loadu_si512((const void *)(k->bias32 + co));
                    for (int64_t ox = xl; ox < xr; ox++) {
                        const int64_t o = (ox * sw - pl) * c + co;
                        __m512 acc = _mm512_mul_ps(dwv_load(r0 + o), f[0]);
                        acc = _mm512_fmadd_ps(dwv_load(r0 + o + c), f[1], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r0 + o + 2 * c), f[2], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r1 + o), f[3], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r1 + o + c), f[4], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r1 + o + 2 * c), f[5], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r2 + o), f[6], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r2 + o + c), f[7], acc);
                        acc = _mm512_fmadd_ps(dwv_load(r2 + o + 2 * c), f[8], acc);
                        _mm_storeu_si128((__m128i *)(orow + ox * c + co), q8_rq16(
                            _mm512_add_epi32(_mm512_cvtps_epi32(acc), bv), &tab, k));
                    }
                    continue;
                }
                for (int64_t ox = xl; ox < xr; ox++) {
                    const int64_t o = (ox * sw - pl) * c + co;
                    __m512 acc = _mm512_mul_ps(dwv_load(r0 + o), f[0]);
                    acc = _mm512_fmadd_ps(dwv_load(r0 + o + c), f[1], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r0 + o + 2 * c), f[2], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r1 + o), f[3], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r1 + o + c), f[4], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r1 + o + 2 * c), f[5], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r2 + o), f[6], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r2 + o + c), f[7], acc);
                    acc = _mm512_fmadd_ps(dwv_load(r2 + o + 2 * c), f[8], acc);
                    dwv_store(acc, corr, rq, c, co, k, orow + ox * c + co);
                }
            }
        }
    }
}
#elif defined(__AVX2__)
/* The same with AVX2: 8 channels per vector (the caller's 16 as two), the int32
 * requantisation by q8_rq8x32, the int64 steps by the scalar loop of q8_requant_row. */
typedef struct {
    int64_t zout, lo, hi;
    int use32;
    const int32_t *rq32, *bias32;
} dwv2_consts;

static inline __m256 dwv2_fma(__m256 a, __m256 b, __m256 c)
{
#ifdef __FMA__
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c); /* exact as well: integers below 2**24 */
#endif
}

static inline void dwv2_store(__m256 acc, const int64_t *corr, const int64_t *rq, int64_t c,
                              int64_t co, const dwv2_consts *k, uint8_t *o)
{
    const __m256i a = _mm256_cvtps_epi32(acc); /* exact: an integer below 2**24 */
    if (k->use32) {
        _mm_storel_epi64((__m128i *)o, q8_rq8x32(_mm256_add_epi32(
            a, _mm256_loadu_si256((const __m256i *)(k->bias32 + co))), k->rq32, c, co,
            (int32_t)k->zout, (int32_t)k->lo, (int32_t)k->hi));
        return;
    }
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, a);
    q8_requant_row(t, corr + co, rq + co, 8, c, k->zout, k->lo, k->hi, o, 0, 0);
}

static inline __attribute__((always_inline)) void
dwv2_pixel(const float *ib, int64_t ring, const int64_t *p, const float *filt,
           const int64_t *corr, const int64_t *rq, const dwv2_consts *k, int64_t iy0,
           int64_t ix0, uint8_t *o)
{
    const int64_t w = p[P_W], c = p[P_C], kw = p[P_KW], dh = p[P_DH], dw = p[P_DW];
    int64_t ky0, ky1, kx0, kx1;
    tap_range(iy0, p[P_KH], dh, p[P_H], &ky0, &ky1);
    tap_range(ix0, kw, dw, w, &kx0, &kx1);
    for (int64_t co = 0; co < c; co += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t ky = ky0; ky < ky1; ky++) {
            const float *irow = ib + (((iy0 + ky * dh) % ring) * w + ix0) * c + co;
            const float *frow = filt + ky * kw * c + co;
            for (int64_t kx = kx0; kx < kx1; kx++)
                acc = dwv2_fma(_mm256_loadu_ps(irow + kx * dw * c),
                               _mm256_loadu_ps(frow + kx * c), acc);
        }
        dwv2_store(acc, corr, rq, c, co, k, o + co);
    }
}

/* Input rows iy in [*done, upto) of batch b as float32 (x - zin, exact), row iy at
 * xf + (iy % ring) * W * C: a ring of the rows one output row reads, converted just before
 * they are read, so they stay in cache (a pass over the whole input first would write and
 * read back 4 bytes a value through memory). */
static inline void dwv2_convert_rows(const uint8_t *in, float *xf, const int64_t *p, int64_t b,
                                     int64_t ring, int64_t *done, int64_t upto, int sin,
                                     __m256 zin)
{
    const int64_t h = p[P_H], wc = p[P_W] * p[P_C];
    upto = upto > h ? h : upto;
    for (int64_t iy = *done; iy < upto; iy++) {
        const uint8_t *src = in + (b * h + iy) * wc;
        float *dst = xf + (iy % ring) * wc;
        for (int64_t i = 0; i < wc; i += 8) {
            const __m128i v = _mm_loadl_epi64((const __m128i *)(src + i));
            const __m256i w = sin ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
            _mm256_storeu_ps(dst + i, _mm256_sub_ps(_mm256_cvtepi32_ps(w), zin));
        }
    }
    if (upto > *done)
        *done = upto;
}

static void dwv2_all(const uint8_t *in, int sin, __m256 zin, float *xf, void *out_,
                     const int64_t *p, const float *filt, const int64_t *corr,
                     const int64_t *rq, const dwv2_consts *k)
{
    const int64_t n = p[P_N], h = p[P_H], w = p[P_W], c = p[P_C];
    const int64_t oh = p[P_OH], ow = p[P_OW];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL];
    const int fast = kh == 3 && kw == 3 && dh == 1 && dw == 1;
    int64_t xl, xr, yl, yr;
    interior(ow, sw, pl, kw, dw, w, &xl, &xr);
    interior(oh, sh, pt, kh, dh, h, &yl, &yr);
    /* the rows one output row reads (all of them where that is the whole height) */
    const int64_t ring = (kh - 1) * dh + 1 < h ? (kh - 1) * dh + 1 : h;
    for (int64_t b = 0; b < n; b++) {
        const float *ib = xf;
        int64_t done = 0;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            dwv2_convert_rows(in, xf, p, b, ring, &done, iy0 + (kh - 1) * dh + 1, sin, zin);
            uint8_t *orow = (uint8_t *)out_ + ((b * oh + oy) * ow) * c;
            const int row_fast = fast && oy >= yl && oy < yr && xr > xl;
            for (int64_t ox = 0; ox < ow; ox++) {
                if (row_fast && ox == xl)
                    ox = xr;
                if (ox >= ow)
                    break;
                dwv2_pixel(ib, ring, p, filt, corr, rq, k, iy0, ox * sw - pl, orow + ox * c);
            }
            if (!row_fast)
                continue;
            const float *r0 = ib + (iy0 % ring) * w * c, *r1 = ib + ((iy0 + 1) % ring) * w * c,
                        *r2 = ib + ((iy0 + 2) % ring) * w * c;
            for (int64_t co = 0; co < c; co += 8) {
                __m256 f[9];
                for (int t = 0; t < 9; t++)
                    f[t] = _mm256_loadu_ps(filt + t * c + co);
                if (k->use32) {
                    const q8_tab8 t = q8_load_tab8(k->rq32, c, co);
                    const __m256i bv = _mm256_loadu_si256((const __m256i *)(k->bias32 + co));
                    const __m256i vz = _mm256_set1_epi32((int32_t)k->zout);
                    const __m256i vlo = _mm256_set1_epi32((int32_t)k->lo);
                    const __m256i vhi = _mm256_set1_epi32((int32_t)k->hi);
                    for (int64_t ox = xl; ox < xr; ox++) {
                        const int64_t o = (ox * sw - pl) * c + co;
                        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(r0 + o), f[0]);
                        acc = dwv2_fma(_mm256_loadu_ps(r0 + o + c), f[1], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r0 + o + 2 * c), f[2], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r1 + o), f[3], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r1 + o + c), f[4], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r1 + o + 2 * c), f[5], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r2 + o), f[6], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r2 + o + c), f[7], acc);
                        acc = dwv2_fma(_mm256_loadu_ps(r2 + o + 2 * c), f[8], acc);
                        /* exact: an integer below 2**24 */
                        const __m256i x = _mm256_add_epi32(_mm256_cvtps_epi32(acc), bv);
                        _mm_storel_epi64((__m128i *)(orow + ox * c + co),
                                         q8_bytes8(q8_rq8x32t(x, &t, vz, vlo, vhi)));
                    }
                    continue;
                }
                for (int64_t ox = xl; ox < xr; ox++) {
                    const int64_t o = (ox * sw - pl) * c + co;
                    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(r0 + o), f[0]);
                    acc = dwv2_fma(_mm256_loadu_ps(r0 + o + c), f[1], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r0 + o + 2 * c), f[2], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r1 + o), f[3], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r1 + o + c), f[4], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r1 + o + 2 * c), f[5], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r2 + o), f[6], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r2 + o + c), f[7], acc);
                    acc = dwv2_fma(_mm256_loadu_ps(r2 + o + 2 * c), f[8], acc);
                    dwv2_store(acc, corr, rq, c, co, k, orow + ox * c + co);
                }
            }
        }
    }
}
#endif

int64_t nnhal_dwconv_q8v(const void *in_, void *out_, const int64_t *p, const float *filt,
                         const int64_t *corr, const int64_t *rq, const int64_t *q,
                         const int32_t *bias32, const int32_t *rq32, float *xf)
{
#ifdef __AVX512F__
    if (p[P_MULT] != 1 || p[P_C] % 16 != 0 || p[P_COUT] != p[P_C])
        return 0;
    q8_consts k = q8_make_consts(q[1], q[2], q[3]);
    k.use32 = bias32 != 0 && rq32 != 0;
    k.rq32 = rq32;
    k.bias32 = bias32;
    const __m512 zin = _mm512_set1_ps((float)q[0]);
    /* the input minus its zero point as float32, once (each value is read by KH*KW taps) */
    const int64_t total = p[P_N] * p[P_H] * p[P_W] * p[P_C];
    const uint8_t *in = in_;
    for (int64_t i = 0; i < total; i += 16)
        _mm512_storeu_ps(xf + i, dwv_convert(in + i, (int)q[4], zin));
    dwv_all(xf, out_, p, filt, corr, rq, &k);
    return 1;
#elif defined(__AVX2__)
    if (p[P_MULT] != 1 || p[P_C] % 16 != 0 || p[P_COUT] != p[P_C])
        return 0;
    const int use32 = bias32 != 0 && rq32 != 0;
    const dwv2_consts k = {q[1], q[2], q[3], use32, rq32, bias32};
    dwv2_all(in_, (int)q[4], _mm256_set1_ps((float)q[0]), xf, out_, p, filt, corr, rq, &k);
    return 1;
#else
    (void)in_; (void)out_; (void)p; (void)filt; (void)corr; (void)rq; (void)q; (void)bias32;
    (void)rq32; (void)xf;
    return 0;
#endif
}

/* The two 8-bit kernels above with their arguments in one int64 array (one ctypes argument
 * instead of ten: the conversions cost more than a small layer's arithmetic):
 * a = {in, out, geometry, filter, corr, rq, q, abuf, acc, corr32, rq32} and
 * {in, out, geometry, filter, corr, rq, q, bias32, rq32, xf}. */
void nnhal_conv_q8_a(const int64_t *a)
{
    nnhal_conv_q8((const void *)a[0], (void *)a[1], (const int64_t *)a[2],
                  (const int8_t *)a[3], (const int64_t *)a[4], (const int64_t *)a[5],
                  (const int64_t *)a[6], (uint8_t *)a[7], (int32_t *)a[8],
                  (const int32_t *)a[9], (const int32_t *)a[10]);
}

int64_t nnhal_dwconv_q8v_a(const int64_t *a)
{
    return nnhal_dwconv_q8v((const void *)a[0], (void *)a[1], (const int64_t *)a[2],
                            (const float *)a[3], (const int64_t *)a[4], (const int64_t *)a[5],
                            (const int64_t *)a[6], (const int32_t *)a[7],
                            (const int32_t *)a[8], (float *)a[9]);
}
