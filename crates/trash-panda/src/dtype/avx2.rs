//! Hand-written AVX2 kernels for the conversions the autovectorized loops leave far from memory
//! speed on AVX2-only CPUs (issue 24); AVX-512 CPUs run them too where they beat its loops.
//!
//! Why the generic path is slow there: a scaled conversion decodes a chunk to an f32 buffer,
//! scales it, and encodes it, three loops with a load and a store per element each, and on AVX2
//! (no mask registers, no byte-to-dword conversions LLVM picks well) each comes out as a long
//! chain of unpacks and blends; quantizing also divides and encodes through the same buffer.
//!
//! - fp8 e4m3 -> bf16 times a scale: one scale has only 128 results (one per magnitude; the
//!   sign is the code's), so long runs look them up with `vpshufb` ([`e4m3_to_bf16_scaled`]),
//!   block scales share one table per tile over the tile's rows ([`e4m3_to_bf16_blocks`]), and
//!   short runs or non-finite scales compute in registers.
//! - bf16 -> e4m3 quantization: the amax on the 16-bit patterns, sixteen to a register, and one
//!   fused divide-and-encode loop ([`bf16_to_e4m3_divided`]).
//!
//! Every kernel computes what the branch-free element functions compute (the same integer
//! rounding, the same f32 multiply or division), so results are bit for bit those of the
//! portable path; the tests check every code against the scalar references over a set of scales.
//! The one exception is not a difference: which of two NaN operands a multiply returns is not
//! defined (LLVM may swap the operands of any multiply), so a NaN code times a NaN scale is only
//! checked to be a quiet NaN.

use core::arch::x86_64::*;

use super::cast::f32_bits_to_bf16_bf;
use super::fp8::{e4m3_to_f32_bits, f32_bits_to_e4m3};

/// Below this many codes building the table costs more than it saves (a 128x128 block scale
/// gives runs of 128).
const TABLE_MIN: usize = 2048;

/// Whether [`e4m3_to_bf16_scaled`] looks `n` codes times `k` up in a table (else it computes).
pub(crate) fn uses_table(n: usize, k: f32) -> bool {
    k.is_finite() && n >= TABLE_MIN
}

/// e4m3fn codes times `k`, rounded to bf16: equal to decoding each code to f32 exactly,
/// multiplying by `k` in f32 and rounding to nearest even (NaN -> `0x7FC0 | sign`). `dst` holds
/// two bytes per code of `src`.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn e4m3_to_bf16_scaled(src: &[u8], dst: &mut [u8], k: f32) {
    if uses_table(src.len(), k) {
        e4m3_to_bf16_table(src, dst, k);
    } else {
        e4m3_to_bf16_computed(src, dst, k);
    }
}

/// [`e4m3_to_bf16_scaled`] for a finite `k`, by table: with one scale there are only 128
/// results, one per magnitude, and a negative code's result is the positive one's with the
/// sign bit set (the product's sign is the code's, and rounding to nearest even is symmetric;
/// the NaN code keeps its sign through a multiply by a finite number). A non-finite `k` breaks
/// that symmetry (0 x inf gives the one default NaN for both signs), hence the guard.
///
/// The table is looked up 32 codes at a time with `vpshufb`, which indexes 16 bytes: eight
/// lookups cover the 128 magnitudes. Lookup t uses the index `mag - 16 t`, whose low four bits
/// are the entry and whose sign bit (set for the magnitudes below block t) makes `vpshufb` give
/// zero; the magnitudes above block t give a stray entry, which the tables cancel by holding
/// `T_t ^ T_(t-1)`, so the XOR over t = 0..=s leaves `T_s`. About 1.5 instructions a code,
/// against 3.5 for computing each result.
#[target_feature(enable = "avx2,fma")]
fn e4m3_to_bf16_table(src: &[u8], dst: &mut [u8], k: f32) {
    let n = src.len().min(dst.len() / 2);
    let done = lookup(&src[..n], &mut dst[..2 * n], &Table::new(k));
    e4m3_to_bf16_computed(&src[done..n], &mut dst[2 * done..2 * n], k);
}

/// The 128 results of one finite scale, as the sixteen `vpshufb` tables [`lookup`] reads.
struct Table {
    low: [__m256i; 8],
    high: [__m256i; 8],
}

impl Table {
    #[target_feature(enable = "avx2,fma")]
    fn new(k: f32) -> Table {
        let mut codes = [0u8; 128];
        for (i, c) in codes.iter_mut().enumerate() {
            *c = i as u8;
        }
        let mut results = [0u8; 256];
        e4m3_to_bf16_computed(&codes, &mut results, k);
        let (mut low, mut high) = ([[0u8; 16]; 8], [[0u8; 16]; 8]);
        for (i, r) in results.chunks_exact(2).enumerate() {
            low[i / 16][i % 16] = r[0];
            high[i / 16][i % 16] = r[1];
        }
        // Descending, so each T_(t-1) is still the plain table when T_t takes it in.
        for t in (1..8).rev() {
            for j in 0..16 {
                low[t][j] ^= low[t - 1][j];
                high[t][j] ^= high[t - 1][j];
            }
        }
        // SAFETY: each row of `low` and `high` is 16 bytes, the size of the unaligned load.
        let load = |row: &[u8; 16]| unsafe { _mm_loadu_si128(row.as_ptr().cast()) };
        Table {
            low: low.map(|r| _mm256_broadcastsi128_si256(load(&r))),
            high: high.map(|r| _mm256_broadcastsi128_si256(load(&r))),
        }
    }
}

/// Looks up the codes of `src` in `table` into `dst` (two bytes per code), 32 at a time;
/// returns how many it did (the rest, under 32, is the caller's).
#[target_feature(enable = "avx2,fma")]
fn lookup(src: &[u8], dst: &mut [u8], table: &Table) -> usize {
    let n = src.len().min(dst.len() / 2);
    let (tl, th) = (&table.low, &table.high);
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: i + 32 <= n <= src.len(), so the 32 bytes at src[i..] are in bounds; loadu has
        // no alignment requirement.
        let c = unsafe { _mm256_loadu_si256(src.as_ptr().add(i).cast()) };
        let mut idx = _mm256_and_si256(c, _mm256_set1_epi8(0x7F));
        let mut lo = _mm256_shuffle_epi8(tl[0], idx);
        let mut hi = _mm256_shuffle_epi8(th[0], idx);
        for t in 1..8 {
            idx = _mm256_sub_epi8(idx, _mm256_set1_epi8(16));
            lo = _mm256_xor_si256(lo, _mm256_shuffle_epi8(tl[t], idx));
            hi = _mm256_xor_si256(hi, _mm256_shuffle_epi8(th[t], idx));
        }
        // The code's sign bit is the result's (bit 15, bit 7 of the high byte).
        hi = _mm256_xor_si256(hi, _mm256_and_si256(c, _mm256_set1_epi8(i8::MIN)));
        // Byte unpacks work within 128-bit halves: a = codes 0-7 | 16-23, b = 8-15 | 24-31.
        let a = _mm256_unpacklo_epi8(lo, hi);
        let b = _mm256_unpackhi_epi8(lo, hi);
        let first = _mm256_permute2x128_si256(a, b, 0x20);
        let second = _mm256_permute2x128_si256(a, b, 0x31);
        // SAFETY: 2 * (i + 32) <= 2 * n <= dst.len(), so the 64 bytes at dst[2 * i..] are in
        // bounds; storeu has no alignment requirement.
        unsafe {
            let d = dst.as_mut_ptr().add(2 * i);
            _mm256_storeu_si256(d.cast(), first);
            _mm256_storeu_si256(d.add(32).cast(), second);
        }
        i += 32;
    }
    i
}

/// Whole rows `first_row..` of an e4m3fn -> bf16 expansion with `block` x `block` scales
/// (`scales` row-major over the tile grid, as `Scale::Block`). A tile's 128 results are shared
/// by `block` rows, so each block row builds one table per tile and every row of it looks its
/// segments up: the table costs 1/`block` of a lookup per code instead of as much again.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn e4m3_to_bf16_blocks(
    src: &[u8],
    dst: &mut [u8],
    cols: usize,
    first_row: usize,
    scales: &[f32],
    block: usize,
) {
    if cols == 0 || block == 0 {
        return;
    }
    let tiles = cols.div_ceil(block);
    let mut tables: Vec<Option<Table>> = Vec::new();
    let mut tables_of = usize::MAX;
    let rows = src.chunks_exact(cols).zip(dst.chunks_exact_mut(2 * cols));
    for (i, (s, d)) in rows.enumerate() {
        let block_row = (first_row + i) / block;
        let ks = &scales[block_row * tiles..][..tiles];
        if block_row != tables_of {
            // Non-finite scales have no table (see `e4m3_to_bf16_table`): computed instead.
            tables = ks
                .iter()
                .map(|&k| k.is_finite().then(|| Table::new(k)))
                .collect();
            tables_of = block_row;
        }
        let segments = s.chunks(block).zip(d.chunks_mut(2 * block));
        for ((s, d), (k, table)) in segments.zip(ks.iter().zip(&tables)) {
            let done = match table {
                Some(t) => lookup(s, d, t),
                None => 0,
            };
            e4m3_to_bf16_computed(&s[done..], &mut d[2 * done..], *k);
        }
    }
}

/// [`e4m3_to_bf16_scaled`] computing each result in registers (any `k`, any length).
#[target_feature(enable = "avx2,fma")]
fn e4m3_to_bf16_computed(src: &[u8], dst: &mut [u8], k: f32) {
    let n = src.len().min(dst.len() / 2);
    let kv = _mm256_set1_ps(k);
    // The subnormal codes m = 0..7 are m * 2^-9; `vpermps` reads this with the low 3 bits.
    let sub_table = _mm256_setr_ps(
        0.0,
        1.0 / 512.0,
        2.0 / 512.0,
        3.0 / 512.0,
        4.0 / 512.0,
        5.0 / 512.0,
        6.0 / 512.0,
        7.0 / 512.0,
    );
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= src.len(), so the 16 bytes at src[i..] are in bounds;
        // loadu has no alignment requirement.
        let bytes = unsafe { _mm_loadu_si128(src.as_ptr().add(i).cast()) };
        let lo = decode_scale(_mm256_cvtepu8_epi32(bytes), kv, sub_table);
        let hi = decode_scale(
            _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)),
            kv,
            sub_table,
        );
        // Every lane holds a value below 0x1_0000, so the unsigned-saturating pack is exact; it
        // interleaves 128-bit halves, which the 64-bit permute puts back in order.
        let packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0b11_01_10_00);
        // SAFETY: 2 * (i + 16) <= 2 * n <= dst.len(), so the 32 bytes at dst[2 * i..] are in
        // bounds; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(2 * i).cast(), packed) };
        i += 16;
    }
    for (s, d) in src[i..n].iter().zip(dst[2 * i..].chunks_exact_mut(2)) {
        let x = f32::from_bits(e4m3_to_f32_bits(*s)) * k;
        d.copy_from_slice(&f32_bits_to_bf16_bf(x.to_bits()).to_le_bytes());
    }
}

/// Eight codes (one per 32-bit lane) times `kv`, as bf16 bits in the low half of each lane.
#[target_feature(enable = "avx2,fma")]
fn decode_scale(c: __m256i, kv: __m256, sub_table: __m256) -> __m256i {
    let mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
    let sign = _mm256_and_si256(_mm256_slli_epi32(c, 24), _mm256_set1_epi32(i32::MIN));
    // Normal codes: rebias the exponent from 7 to 127 in place.
    let normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
    let sub = _mm256_permutevar8x32_ps(sub_table, mag);
    // mag - 8 is negative exactly for the subnormals; blendv reads that sign bit.
    let below = _mm256_castsi256_ps(_mm256_sub_epi32(mag, _mm256_set1_epi32(8)));
    let v = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, below));
    // The NaN code 0x7F decodes through `normal` to 0x43F0_0000; OR-ing 0x7FF0_0000 gives
    // exactly the NaN pattern of the reference (0x7FF0_0000).
    let nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
    let v = _mm256_or_si256(v, _mm256_and_si256(nan, _mm256_set1_epi32(0x7FF0_0000)));
    let x = _mm256_castsi256_ps(_mm256_or_si256(v, sign));
    // A NaN code gives its own NaN (any finite or infinite scale); see the module notes for two.
    let p = _mm256_mul_ps(x, kv);
    // bf16 rounding as `f32_bits_to_bf16_bf`: add 0x7FFF plus the kept lsb, truncate.
    let w = _mm256_castps_si256(p);
    let hi = _mm256_srli_epi32(w, 16);
    let bias = _mm256_add_epi32(
        _mm256_and_si256(hi, _mm256_set1_epi32(1)),
        _mm256_set1_epi32(0x7FFF),
    );
    let rounded = _mm256_srli_epi32(_mm256_add_epi32(w, bias), 16);
    let is_nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
    let nan_out = _mm256_or_si256(
        _mm256_and_si256(hi, _mm256_set1_epi32(0x8000)),
        _mm256_set1_epi32(0x7FC0),
    );
    _mm256_blendv_epi8(rounded, nan_out, is_nan)
}

/// The bits of max |x| over the non-NaN bf16 values of `src` as f32 bits (0 when there are
/// none): what `amax_bits` gives for a bf16 source. Works on the 16-bit patterns directly,
/// sixteen to a register, since widening to f32 only appends zero bits.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn bf16_amax_bits(src: &[u8]) -> u32 {
    let n = src.len() / 2;
    let mut best = _mm256_setzero_si256();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 2 * (i + 16) <= 2 * n <= src.len(): the 32 bytes at src[2 * i..] are in
        // bounds; loadu has no alignment requirement.
        let h = unsafe { _mm256_loadu_si256(src.as_ptr().add(2 * i).cast()) };
        let a = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
        // NaNs count as 0; `a` is below 0x8000, so the signed compare is the unsigned one.
        let nan = _mm256_cmpgt_epi16(a, _mm256_set1_epi16(0x7F80));
        best = _mm256_max_epu16(best, _mm256_andnot_si256(nan, a));
        i += 16;
    }
    let mut lanes = [0u16; 16];
    // SAFETY: `lanes` is 32 bytes, the size of the unaligned store.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), best) };
    let mut m = lanes.into_iter().max().unwrap_or(0);
    for s in src[2 * i..2 * n].chunks_exact(2) {
        let a = u16::from_le_bytes([s[0], s[1]]) & 0x7FFF;
        m = m.max(if a > 0x7F80 { 0 } else { a });
    }
    u32::from(m) << 16
}

/// Eight f32 values (already divided by the scale) to e4m3fn codes, one per 32-bit lane, as
/// `f32_bits_to_e4m3` gives them.
#[target_feature(enable = "avx2,fma")]
fn encode_e4m3(v: __m256) -> __m256i {
    let w = _mm256_castps_si256(v);
    let a = _mm256_and_si256(w, _mm256_set1_epi32(0x7FFF_FFFF));
    let sign = _mm256_and_si256(_mm256_srli_epi32(w, 24), _mm256_set1_epi32(0x80));
    // Normal range, as the scalar code: round to nearest even by adding just under half an ulp
    // plus the kept lsb, truncate, rebias 127 -> 7.
    let lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7_FFFF)), lsb);
    let normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
    // Codes rise with the magnitude and 448 (or anything rounding to it) is 0x7E, so a min is
    // the saturation of everything at or above 448, infinity included.
    let normal = _mm256_min_epu32(normal, _mm256_set1_epi32(0x7E));
    // Subnormal range (< 2^-6): the count of 2^-9 steps rounded to nearest even, which the
    // multiply (exact: a power of two) and the conversion (MXCSR's default rounding) give, as
    // in the reference encoder.
    let steps = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0));
    let sub = _mm256_cvtps_epi32(steps);
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C80_0000), a);
    let code = _mm256_blendv_epi8(normal, sub, is_sub);
    // NaN: 0x7E | 1 = 0x7F (a NaN's `normal` saturated to 0x7E above).
    let nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F80_0000));
    let code = _mm256_or_si256(code, _mm256_and_si256(nan, _mm256_set1_epi32(1)));
    _mm256_or_si256(code, sign)
}

/// `e4m3fn(clamp(x / k, -448, 448))` for the bf16 values of `src` into `dst` (one byte each):
/// what `encode_scaled` gives for a bf16 source. The division is a true one, so `k` need not be
/// a power of two; the clamp is the encoder's saturation.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn bf16_to_e4m3_divided(src: &[u8], dst: &mut [u8], k: f32) {
    let n = (src.len() / 2).min(dst.len());
    let kv = _mm256_set1_ps(k);
    let quarter = |h: __m128i| {
        let x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        encode_e4m3(_mm256_div_ps(x, kv))
    };
    let mut i = 0;
    while i + 32 <= n {
        // SAFETY: 2 * (i + 32) <= 2 * n <= src.len(): the 64 bytes at src[2 * i..] are in
        // bounds; loadu has no alignment requirement.
        let (h0, h1) = unsafe {
            let p = src.as_ptr().add(2 * i);
            (
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(32).cast()),
            )
        };
        let a = quarter(_mm256_castsi256_si128(h0));
        let b = quarter(_mm256_extracti128_si256(h0, 1));
        let c = quarter(_mm256_castsi256_si128(h1));
        let d = quarter(_mm256_extracti128_si256(h1, 1));
        // Codes fit a byte, so the saturating packs are exact; they leave the four-code groups
        // in the order a0 b0 c0 d0 a1 b1 c1 d1, which the dword permute undoes.
        let bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: i + 32 <= n <= dst.len(): the 32 bytes at dst[i..] are in bounds; storeu has
        // no alignment requirement.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), bytes) };
        i += 32;
    }
    for (s, d) in src[2 * i..2 * n].chunks_exact(2).zip(&mut dst[i..n]) {
        let x = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
        *d = f32_bits_to_e4m3((x / k).to_bits());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{f32_to_bf16_bits, fp8_e4m3fn_to_f32, SimdLevel};

    type Kernel = unsafe fn(&[u8], &mut [u8], f32);

    fn scales() -> Vec<f32> {
        let mut k = vec![
            1.0,
            -1.0,
            0.0,
            -0.0,
            0.37,
            1e-3,
            448.0,
            3.0e38,
            1.0e-30,
            // Subnormal products: the smallest e4m3 value (2^-9) times these lands below 2^-126.
            1.0e-36,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MAX,
        ];
        let mut x = 0x9E37_79B9u32;
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            // Any finite pattern, most of them in the range scales live in.
            let w = (x & 0x807F_FFFF) | ((100 + (x >> 23) % 40) << 23);
            k.push(f32::from_bits(w));
        }
        k
    }

    #[test]
    fn e4m3_to_bf16_scaled_equals_the_reference_on_every_code() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        // Every code nine times over (past the table's threshold), shifted by 0 and 3, so the
        // vector body, the tail and every lane position each see every code.
        let codes: Vec<u8> = (0..=255u8).cycle().take(256 * 9 + 35).collect();
        for k in scales() {
            for start in [0, 3] {
                let src = &codes[start..];
                let kernels: [(&str, Kernel); 3] = [
                    ("computed", e4m3_to_bf16_computed),
                    ("table", e4m3_to_bf16_table),
                    ("dispatch", e4m3_to_bf16_scaled),
                ];
                for (name, kernel) in kernels {
                    // The table holds only for finite scales; the dispatcher guards that.
                    if name == "table" && !k.is_finite() {
                        continue;
                    }
                    let mut got = vec![0u8; src.len() * 2];
                    // SAFETY: the CPU has AVX2 and FMA (checked above).
                    unsafe { kernel(src, &mut got, k) };
                    for (c, g) in src.iter().zip(got.chunks_exact(2)) {
                        let x = fp8_e4m3fn_to_f32(*c);
                        let want = f32_to_bf16_bits(x * k);
                        let g = u16::from_le_bytes([g[0], g[1]]);
                        // Which NaN a product of two NaNs gives is not defined (LLVM may swap
                        // the operands); only the quiet-NaN shape is.
                        if x.is_nan() && k.is_nan() {
                            assert_eq!(g & 0x7FFF, 0x7FC0, "{name} code {c:#04x}");
                            continue;
                        }
                        let ctx =
                            format!("{name}: code {c:#04x} scale {k:e} ({:#010x})", k.to_bits());
                        assert_eq!(g, want, "{ctx}");
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_amax_equals_the_reference() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        let mut x = 0x2545_F491u32;
        let mut pats: Vec<u16> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u16
            })
            .collect();
        pats.extend([0x7F80, 0xFF80, 0x7FC0, 0xFFFF, 0x7F81, 0x0001, 0x8000]);
        for len in [0, 1, 15, 16, 17, 100, pats.len()] {
            for start in [0, 5] {
                let v = &pats[start.min(len)..len.max(start.min(len))];
                let bytes: Vec<u8> = v.iter().flat_map(|h| h.to_le_bytes()).collect();
                let want = v
                    .iter()
                    .map(|h| {
                        let a = (u32::from(*h) << 16) & 0x7FFF_FFFF;
                        if a > 0x7F80_0000 {
                            0
                        } else {
                            a
                        }
                    })
                    .max()
                    .unwrap_or(0);
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                let got = unsafe { bf16_amax_bits(&bytes) };
                assert_eq!(got, want, "len {len} start {start}");
            }
        }
    }

    #[test]
    fn bf16_to_e4m3_equals_the_reference_on_every_bf16() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        // Every bf16 pattern, plus 7 so the tail sees some too.
        let src: Vec<u8> = (0..=u16::MAX)
            .chain(0x3C00..0x3C07)
            .flat_map(u16::to_le_bytes)
            .collect();
        let ks = [
            1.0f32,
            1.0 / 448.0,
            0.37,
            3.0,
            // Results far below the e4m3 subnormals and into f32 subnormals.
            1.0e30,
            3.0e38,
            // Results that overflow f32 and saturate.
            1.0e-30,
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            -0.5,
            0.0,
            f32::INFINITY,
        ];
        for k in ks {
            let mut got = vec![0u8; src.len() / 2];
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe { bf16_to_e4m3_divided(&src, &mut got, k) };
            for (s, g) in src.chunks_exact(2).zip(&got) {
                let h = u16::from_le_bytes([s[0], s[1]]);
                let v = f32::from_bits(u32::from(h) << 16) / k;
                let v = if v > 448.0 { 448.0 } else { v };
                let v = if v < -448.0 { -448.0 } else { v };
                let want = crate::dtype::f32_to_fp8_e4m3fn(v);
                // A NaN's sign after a division is not defined; its shape is.
                if v.is_nan() {
                    assert_eq!(g & 0x7F, 0x7F, "bf16 {h:#06x} scale {k:e}");
                    continue;
                }
                assert_eq!(*g, want, "bf16 {h:#06x} scale {k:e}");
            }
        }
    }

    #[test]
    fn e4m3_to_bf16_blocks_equals_the_reference() {
        if !SimdLevel::Avx2.is_supported() {
            return;
        }
        let all = scales();
        for (rows, cols, block, first_row) in [
            (300usize, 200usize, 128usize, 0usize),
            (70, 333, 64, 37),
            (5, 40, 128, 250),
        ] {
            let tiles = cols.div_ceil(block);
            let grid = (first_row + rows).div_ceil(block) * tiles;
            // Cycle through the scale set (NaN and infinity included) over the tiles.
            let ks: Vec<f32> = (0..grid).map(|t| all[(t * 7) % all.len()]).collect();
            let src: Vec<u8> = (0..rows * cols).map(|i| (i * 37 + i / 255) as u8).collect();
            let mut got = vec![0u8; src.len() * 2];
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe { e4m3_to_bf16_blocks(&src, &mut got, cols, first_row, &ks, block) };
            for (i, (c, g)) in src.iter().zip(got.chunks_exact(2)).enumerate() {
                let (r, col) = (first_row + i / cols, i % cols);
                let k = ks[r / block * tiles + col / block];
                let x = fp8_e4m3fn_to_f32(*c);
                let g = u16::from_le_bytes([g[0], g[1]]);
                if x.is_nan() && k.is_nan() {
                    assert_eq!(g & 0x7FFF, 0x7FC0);
                    continue;
                }
                assert_eq!(
                    g,
                    f32_to_bf16_bits(x * k),
                    "row {r} col {col} code {c:#04x} k {k:e}"
                );
            }
        }
    }
}
