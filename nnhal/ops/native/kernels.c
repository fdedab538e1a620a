/* Native float32 convolution kernels of the nnhal reference driver.
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
int64_t nnhal_abi_version(void) { return 1; }

/* Depthwise convolution. filt is [KH][KW][COUT] (the NNAPI filter [1, KH, KW, COUT] as is),
 * output channel co reads input channel co / MULT. */
void nnhal_dwconv_f32(const float *in, float *out, const int64_t *p, const float *filt,
                      const float *bias, float lo, float hi)
{
    const int64_t n = p[P_N], h = p[P_H], w = p[P_W], c = p[P_C];
    const int64_t oh = p[P_OH], ow = p[P_OW], cout = p[P_COUT];
    const int64_t kh = p[P_KH], kw = p[P_KW], sh = p[P_SH], sw = p[P_SW];
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL], m = p[P_MULT];
    const int64_t cv = (m == 1) ? (cout / 8) * 8 : 0; /* channels done 8 at a time */

    for (int64_t b = 0; b < n; b++) {
        const float *ib = in + b * h * w * c;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            /* taps ky with 0 <= iy0 + ky*dh < h */
            int64_t ky0 = 0, ky1 = kh;
            while (ky0 < kh && iy0 + ky0 * dh < 0) ky0++;
            while (ky1 > ky0 && iy0 + (ky1 - 1) * dh >= h) ky1--;
            float *orow = out + ((b * oh + oy) * ow) * cout;
            for (int64_t ox = 0; ox < ow; ox++) {
                const int64_t ix0 = ox * sw - pl;
                int64_t kx0 = 0, kx1 = kw;
                while (kx0 < kw && ix0 + kx0 * dw < 0) kx0++;
                while (kx1 > kx0 && ix0 + (kx1 - 1) * dw >= w) kx1--;
                float *op = orow + ox * cout;
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
    const int64_t dh = p[P_DH], dw = p[P_DW], pt = p[P_PT], pl = p[P_PL];
    const int64_t nb = (cout + 7) / 8;
    const int64_t blk = kh * kw * c * 8; /* floats of one packed output-channel block */

    for (int64_t b = 0; b < n; b++) {
        const float *ib = in + b * h * w * c;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t iy0 = oy * sh - pt;
            int64_t ky0 = 0, ky1 = kh;
            while (ky0 < kh && iy0 + ky0 * dh < 0) ky0++;
            while (ky1 > ky0 && iy0 + (ky1 - 1) * dh >= h) ky1--;
            float *orow = out + ((b * oh + oy) * ow) * cout;
            for (int64_t ox = 0; ox < ow; ox++) {
                const int64_t ix0 = ox * sw - pl;
                int64_t kx0 = 0, kx1 = kw;
                while (kx0 < kw && ix0 + kx0 * dw < 0) kx0++;
                while (kx1 > kx0 && ix0 + (kx1 - 1) * dw >= w) kx1--;
                float *op = orow + ox * cout;
                for (int64_t cb = 0; cb < nb; cb++) {
                    const float *fb = filt + cb * blk;
                    v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
                    for (int64_t ky = ky0; ky < ky1; ky++) {
                        const float *irow = ib + (iy0 + ky * dh) * w * c;
                        const float *frow = fb + ky * kw * c * 8;
                        for (int64_t kx = kx0; kx < kx1; kx++) {
                            const float *ip = irow + (ix0 + kx * dw) * c;
                            const float *fp = frow + kx * c * 8;
                            for (int64_t ci = 0; ci < c; ci++)
                                acc += ip[ci] * load8(fp + ci * 8);
                        }
                    }
                    if (cb * 8 + 8 <= cout) {
                        acc += load8(bias + cb * 8);
                        store8_clamped(op + cb * 8, acc, lo, hi);
                    } else {
                        float t[8];
                        memcpy(t, &acc, sizeof t);
                        for (int64_t k = 0; cb * 8 + k < cout; k++)
                            op[cb * 8 + k] = clampf(t[k] + bias[cb * 8 + k], lo, hi);
                    }
                }
            }
        }
    }
}
