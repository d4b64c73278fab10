//! fp8 -> f32 and f16 times a scale (or not), by the exponent-moving tables of `table`, four
//! bytes a result (then F16C's rounding for f16): the generic loops reach half of memcpy (f32)
//! and a fifth (f16) on AVX2, a widening, a decode, a multiply and an encode through the f32
//! buffer.
//!
//! The identity of `table::Table` holds for f32 results as for bf16 ones (the same exponent
//! range; one rounding instead of two): a normal code's product is `F[m] + ((e - bias) << 23)`
//! with `F[m]` the f32 product of its mantissa's value `1 + m/M`. A result's four bytes come
//! from four tables indexed as there, the upper exponent bits and the sign added to the top
//! byte, and two rounds of unpacks put the bytes together.

use core::arch::x86_64::*;

use super::primitives::prefetch;
use super::table::{load_codes, Fp8, Table};
use super::{store, Stores};
use crate::dtype::fp8::{e4m3_to_f32_bits, e5m2_to_f32_bits};
use crate::dtype::half::f32_bits_to_f16_bf;

/// The four-byte results of one scale: sixteen normal and sixteen subnormal entries per byte.
struct Table32 {
    normal: [__m256i; 4],
    sub: [__m256i; 4],
    addend: __m256i,
    indices: [__m256i; 2],
}

impl Table32 {
    /// The tables of `k` (for which [`Table::holds`]) for codes of `fmt`.
    #[target_feature(enable = "avx2,fma")]
    fn new(k: f32, fmt: Fp8) -> Table32 {
        // Mantissas, exponent bias, subnormal codes, and the subnormal step.
        let (mants, bias, subs, step) = match fmt {
            Fp8::E4m3 => (8u32, 7i32, 8u32, 1.0 / 512.0),
            Fp8::E5m2 => (4, 15, 4, 1.0 / 65536.0),
        };
        let mut bytes = [[0u8; 16]; 8];
        for i in 0..16u32 {
            // Entry i holds the low nibble (i + subs) & 15 of the magnitude: mantissa and the
            // exponent's low bits, as in `Table`.
            let nibble = (i + subs) & 15;
            let unit = 1.0 + (nibble % mants) as f32 / mants as f32;
            let low = (nibble / mants) as i32;
            let v = (unit * k)
                .to_bits()
                .wrapping_add(((low - bias) << 23) as u32);
            let s = ((i + subs).wrapping_sub(16) as f32 * step * k).to_bits();
            for b in 0..4 {
                bytes[b][i as usize] = (v >> (8 * b)) as u8;
                if i + subs >= 16 {
                    bytes[4 + b][i as usize] = (s >> (8 * b)) as u8;
                }
            }
        }
        // SAFETY: each row of `bytes` is 16 bytes, the size of the unaligned load.
        let load = |row: &[u8; 16]| unsafe {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(row.as_ptr().cast()))
        };
        // The top byte's addend by `code >> 4`: the sign, then the exponent's upper bits (each
        // 2 (e4m3) or 4 (e5m2) exponent steps, 1 or 2 in the top byte).
        let per_step = if fmt == Fp8::E4m3 { 1 } else { 2 };
        let mut addend = [0u8; 16];
        for (n, a) in (0u8..).zip(addend.iter_mut()) {
            *a = ((n & 7) * per_step) | ((n & 8) << 4);
        }
        Table32 {
            normal: [
                load(&bytes[0]),
                load(&bytes[1]),
                load(&bytes[2]),
                load(&bytes[3]),
            ],
            sub: [
                load(&bytes[4]),
                load(&bytes[5]),
                load(&bytes[6]),
                load(&bytes[7]),
            ],
            addend: load(&addend),
            indices: [
                _mm256_set1_epi8(subs as i8),
                _mm256_set1_epi8(i8::MIN.wrapping_sub(subs as i8)),
            ],
        }
    }
}

/// fp8 codes (of `fmt`) times `k` to f32, or with `half` on to f16 (`dst` holds four or two
/// bytes per code): the bits of decoding each code exactly, multiplying by `k` in f32, and for
/// f16 rounding that by F16C's conversion, which rounds as `f32_bits_to_f16_bf` does. With
/// `k` = 1 it is the plain conversion (the product is exact; a NaN comes back as it went in,
/// already quiet).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8_to_wide_scaled(
    fmt: Fp8,
    half: bool,
    src: &[u8],
    dst: &mut [u8],
    k: f32,
    stores: Stores,
) {
    let size = if half { 2 } else { 4 };
    let n = src.len().min(dst.len() / size);
    if n < 256 || !Table::holds(k) {
        scalar(fmt, half, &src[..n], &mut dst[..size * n], k);
        return;
    }
    let table = Table32::new(k, fmt);
    let (head, stores) = stores.head(dst.as_ptr(), size, n);
    scalar(fmt, half, &src[..head], &mut dst[..size * head], k);
    let finite = fmt.finite();
    let mut i = head;
    while i + 32 <= n {
        // The source is read at a quarter (f32) or half (f16) of the output's rate, too slowly
        // for the hardware prefetcher alone to keep up (as in the other table loops).
        prefetch(src, i);
        // SAFETY: i + 32 <= n <= src.len(): the 32 bytes at src[i..] are in bounds.
        let (c, mag, special) = unsafe { load_codes(src.as_ptr().add(i), finite) };
        if special {
            // A NaN or infinite code (rare; the identity does not cover them).
            let d = &mut dst[size * i..size * (i + 32)];
            scalar(fmt, half, &src[i..i + 32], d, k);
        } else {
            let normal = _mm256_sub_epi8(mag, table.indices[0]);
            let sub = _mm256_add_epi8(mag, table.indices[1]);
            let byte = |t: usize| {
                _mm256_or_si256(
                    _mm256_shuffle_epi8(table.normal[t], normal),
                    _mm256_shuffle_epi8(table.sub[t], sub),
                )
            };
            let top = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi8(0x0F));
            let b3 = _mm256_add_epi8(byte(3), _mm256_shuffle_epi8(table.addend, top));
            let (b0, b1, b2) = (byte(0), byte(1), byte(2));
            // Within 128-bit halves: pairs, then quads; q0 = codes 0-3 | 16-19, q1 = 4-7 |
            // 20-23, q2 = 8-11 | 24-27, q3 = 12-15 | 28-31.
            let (p01l, p01h) = (_mm256_unpacklo_epi8(b0, b1), _mm256_unpackhi_epi8(b0, b1));
            let (p23l, p23h) = (_mm256_unpacklo_epi8(b2, b3), _mm256_unpackhi_epi8(b2, b3));
            let q0 = _mm256_unpacklo_epi16(p01l, p23l);
            let q1 = _mm256_unpackhi_epi16(p01l, p23l);
            let q2 = _mm256_unpacklo_epi16(p01h, p23h);
            let q3 = _mm256_unpackhi_epi16(p01h, p23h);
            let f = [
                _mm256_permute2x128_si256(q0, q1, 0x20),
                _mm256_permute2x128_si256(q2, q3, 0x20),
                _mm256_permute2x128_si256(q0, q1, 0x31),
                _mm256_permute2x128_si256(q2, q3, 0x31),
            ];
            // SAFETY: size * (i + 32) <= size * n <= dst.len(): the 128 (f32) or 64 (f16)
            // bytes at dst[size * i..] are in bounds; aligned when streaming (`head` aligned
            // dst + size * head; steps add 32 * size).
            unsafe {
                let d = dst.as_mut_ptr().add(size * i);
                if half {
                    let h = |v: __m256i| {
                        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_castsi256_ps(v))
                    };
                    store(d, _mm256_set_m128i(h(f[1]), h(f[0])), stores);
                    store(d.add(32), _mm256_set_m128i(h(f[3]), h(f[2])), stores);
                } else {
                    for (j, v) in f.into_iter().enumerate() {
                        store(d.add(32 * j), v, stores);
                    }
                }
            }
        }
        i += 32;
    }
    scalar(fmt, half, &src[i..n], &mut dst[size * i..size * n], k);
}

/// One code at a time, as the reference: decode exactly, multiply in f32 (and round to f16).
fn scalar(fmt: Fp8, half: bool, src: &[u8], dst: &mut [u8], k: f32) {
    let size = if half { 2 } else { 4 };
    for (c, d) in src.iter().zip(dst.chunks_exact_mut(size)) {
        let bits = match fmt {
            Fp8::E4m3 => e4m3_to_f32_bits(*c),
            Fp8::E5m2 => e5m2_to_f32_bits(*c),
        };
        let x = f32::from_bits(bits) * k;
        if half {
            d.copy_from_slice(&f32_bits_to_f16_bf(x.to_bits()).to_le_bytes());
        } else {
            d.copy_from_slice(&x.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::avx2::test_scales;
    use crate::dtype::{f32_to_f16_bits, fp8_e4m3fn_to_f32, fp8_e5m2_to_f32, SimdLevel};

    #[test]
    fn fp8_to_f32_and_f16_equal_the_reference_on_every_code() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        let codes: Vec<u8> = (0..=255u8).cycle().take(256 * 9 + 35).collect();
        // Without NaNs and infinities of either format, so whole steps take the tables.
        let finite: Vec<u8> = codes
            .iter()
            .map(|c| if c & 0x7F >= 0x7C { 0x3B } else { *c })
            .collect();
        let mut ks = test_scales();
        ks.extend([
            f32::from_bits(0x0D80_0000),
            -f32::from_bits(0x7180_0000),
            1.999_999_9,
        ]);
        let cases = [
            (Stores::Cached, 0),
            (Stores::Streaming, 4),
            (Stores::Streaming, 12),
            (Stores::Streaming, 1),
        ];
        for k in ks {
            for fmt in [Fp8::E4m3, Fp8::E5m2] {
                for src in [&codes[..], &codes[3..], &finite[..], &finite[5..]] {
                    for ((stores, off), half) in
                        cases.into_iter().flat_map(|c| [(c, false), (c, true)])
                    {
                        check(fmt, half, src, k, stores, off);
                    }
                }
            }
        }
    }

    fn check(fmt: Fp8, half: bool, src: &[u8], k: f32, stores: Stores, off: usize) {
        let size = if half { 2 } else { 4 };
        let mut buf = vec![0u8; src.len() * 4 + 64];
        let got = &mut buf[off..off + src.len() * size];
        // SAFETY: the caller checked the CPU has AVX2, FMA and F16C.
        unsafe { fp8_to_wide_scaled(fmt, half, src, got, k, stores) };
        for (i, (c, g)) in src.iter().zip(got.chunks_exact(size)).enumerate() {
            let x = match fmt {
                Fp8::E4m3 => fp8_e4m3fn_to_f32(*c),
                Fp8::E5m2 => fp8_e5m2_to_f32(*c),
            };
            // Which NaN a product of two NaNs gives is not defined.
            if x.is_nan() && k.is_nan() {
                continue;
            }
            let (g, want) = if half {
                let g = u32::from(u16::from_le_bytes([g[0], g[1]]));
                (g, u32::from(f32_to_f16_bits(x * k)))
            } else {
                (
                    u32::from_le_bytes([g[0], g[1], g[2], g[3]]),
                    (x * k).to_bits(),
                )
            };
            let what = format!("{fmt:?} f16 {half} {stores:?} {off}: element {i} code {c:#04x}");
            assert_eq!(g, want, "{what} scale {k:e}");
        }
    }
}
