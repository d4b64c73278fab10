//! The `vpshufb` tables of one scale for the fp8 -> bf16 kernels, and the 32-code step that
//! reads them (see [`Table`]); `fp8.rs` runs the steps over runs, rows and tiles.

use core::arch::x86_64::*;

use super::primitives::{pack_16, round_bf16};
use super::{store, Stores};

/// The fp8 formats the tables serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fp8 {
    /// e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, 8 subnormal codes, NaN at 0x7F.
    E4m3,
    /// e5m2: 5 exponent bits (bias 15), 2 mantissa bits, 4 subnormal codes, infinity at 0x7C,
    /// NaNs above.
    E5m2,
}

impl Fp8 {
    /// How many magnitudes are subnormal (zero included).
    fn subnormals(self) -> i8 {
        match self {
            Fp8::E4m3 => 8,
            Fp8::E5m2 => 4,
        }
    }

    /// The largest finite magnitude, in every byte (for [`load_codes`]).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn finite(self) -> __m256i {
        _mm256_set1_epi8(match self {
            Fp8::E4m3 => 0x7E,
            Fp8::E5m2 => 0x7B,
        })
    }
}

/// The results of one scale `k` as four 16-byte `vpshufb` tables (each in both 128-bit halves).
///
/// A normal code is `(1 + j/8) 2^(e-7)` (exponent field e, mantissa j), so its product with `k`
/// is that of `1 + j/8` with its exponent moved by `e - 7`; while every product stays a normal
/// f32 (|k| within 2^-100..2^100, [`Table::holds`]), moving the exponent commutes with both
/// roundings (to f32, then to bf16), so the bf16 result is `B[j] + ((e - 7) << 7)`, with
/// `B[j] = bf16((1 + j/8) k)`. The eight subnormal codes get their own eight results `S[m]`.
///
/// The lookup ([`bytes_of`]) indexes the normal table with `mag - 8`, whose low nibble is `j`
/// and the exponent's low bit (flipped), and whose sign bit (set for the subnormals) makes
/// `vpshufb` give zero; the subnormal table with `mag + 0x78`, which is the other way round.
/// So an entry of the normal table holds `B[j] + ((e & 1) - 7) << 7`, and the rest of the
/// exponent, `(e >> 1) << 8`, and the code's sign are added to the high byte by a third lookup.
/// e5m2 is the same with two mantissa bits, two exponent bits in the nibble, bias 15 and four
/// subnormal codes (`mag - 4`, `mag + 0x7C`).
pub(crate) struct Table {
    /// The format of the codes.
    pub(crate) fmt: Fp8,
    /// The scale.
    pub(crate) k: f32,
    /// Low and high bytes of the normal results, by `(mag - s) & 15` (s subnormal codes).
    normal: [__m256i; 2],
    /// Low and high bytes of the subnormal results, by `(mag + 16 - s) & 15`.
    sub: [__m256i; 2],
    /// The high byte's addend by `code >> 4`.
    addend: __m256i,
    /// `s` and `0x80 - s` in every byte, to index the two tables.
    indices: [__m256i; 2],
}

impl Table {
    /// Whether the exponent-moving identity holds for every code times `k`.
    pub(crate) fn holds(k: f32) -> bool {
        let a = k.abs();
        // False for NaN; 2^-100 and 2^100 are exact f32 constants.
        (f32::from_bits(0x0D80_0000)..=f32::from_bits(0x7180_0000)).contains(&a)
    }

    /// The tables of `k` for codes of `fmt`; [`Table::holds`] must hold for `k`. Built in
    /// registers: a table per row of a per-row scale is built 8192 codes apart, often enough
    /// to show.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn new(k: f32, fmt: Fp8) -> Table {
        let kv = _mm256_set1_ps(k);
        // The codes' values are exact f32 constants, so each product is the reference's
        // `decode(code) * k`, rounded as `f32_bits_to_bf16_bf` does (no NaN: k is finite).
        // Normal entry i holds low nibble L = (i + s) & 15 of the magnitude (s subnormal
        // codes): mantissa L % s' and exponent low bits L / s' (s' = 8 or 4 mantissas), so
        // B[mantissa] + ((low bits - bias) << 7); the two registers are entries 0-7 and 8-15.
        let (units, low, high, subs) = match fmt {
            Fp8::E4m3 => (
                _mm256_setr_ps(1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875),
                _mm256_set1_epi32(-6 << 7),
                _mm256_set1_epi32(-7 << 7),
                // Codes 0-7 are m/512, at entries 8-15.
                _mm256_mul_ps(
                    _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
                    _mm256_set1_ps(1.0 / 512.0),
                ),
            ),
            Fp8::E5m2 => (
                _mm256_setr_ps(1.0, 1.25, 1.5, 1.75, 1.0, 1.25, 1.5, 1.75),
                _mm256_setr_epi32(
                    -14 << 7,
                    -14 << 7,
                    -14 << 7,
                    -14 << 7,
                    -13 << 7,
                    -13 << 7,
                    -13 << 7,
                    -13 << 7,
                ),
                _mm256_setr_epi32(
                    -12 << 7,
                    -12 << 7,
                    -12 << 7,
                    -12 << 7,
                    -15 << 7,
                    -15 << 7,
                    -15 << 7,
                    -15 << 7,
                ),
                // Codes 0-3 are m/65536, at entries 12-15 (8-11 are never read).
                _mm256_mul_ps(
                    _mm256_setr_ps(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0),
                    _mm256_set1_ps(1.0 / 65536.0),
                ),
            ),
        };
        let b = round_bf16(_mm256_castps_si256(_mm256_mul_ps(units, kv)));
        let s = round_bf16(_mm256_castps_si256(_mm256_mul_ps(subs, kv)));
        // Every B has an exponent of at least 27 (|k| >= 2^-100) and the offsets take at most
        // 15 from it, so no entry is negative and the saturating pack is exact.
        let normal = pack_16(_mm256_add_epi32(b, low), _mm256_add_epi32(b, high));
        let sub = pack_16(_mm256_setzero_si256(), s);
        // By `code >> 4` = sign, then the exponent's upper bits: each of those is 2^(e4m3: 1,
        // e5m2: 2) exponent steps, i.e. 1 or 2 in the high byte.
        let addend = match fmt {
            Fp8::E4m3 => _mm256_setr_epi8(
                0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121, 0, 1, 2, 3,
                4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121,
            ),
            Fp8::E5m2 => _mm256_setr_epi8(
                0, 2, 4, 6, 8, 10, 12, 14, -128, -126, -124, -122, -120, -118, -116, -114, 0, 2, 4,
                6, 8, 10, 12, 14, -128, -126, -124, -122, -120, -118, -116, -114,
            ),
        };
        Table {
            fmt,
            k,
            normal: split_bytes(normal),
            sub: split_bytes(sub),
            addend,
            indices: [
                _mm256_set1_epi8(fmt.subnormals()),
                _mm256_set1_epi8(i8::MIN.wrapping_sub(fmt.subnormals())),
            ],
        }
    }
}

/// Sixteen 16-bit values as their low bytes and their high bytes, each 16-byte table in both
/// 128-bit halves (as `vpshufb` reads it).
#[target_feature(enable = "avx2,fma")]
fn split_bytes(v: __m256i) -> [__m256i; 2] {
    // Within each half: the even (low) bytes, then the odd (high) ones.
    let order = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
        7, 9, 11, 13, 15,
    );
    // low bytes 0-7, low 8-15, high 0-7, high 8-15 in 64-bit quarters.
    let q = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, order), 0b11_01_10_00);
    [
        _mm256_permute2x128_si256(q, q, 0x00),
        _mm256_permute2x128_si256(q, q, 0x11),
    ]
}

/// The registers of a [`Table`] that depend on the format alone, not on the scale.
#[derive(Clone, Copy)]
pub(crate) struct Fixed {
    addend: __m256i,
    indices: [__m256i; 2],
}

impl Table {
    /// Its format's part, the same for every table of the format: a loop over many tables
    /// (one per tile of a block scale) keeps it in registers and reads four per table.
    pub(crate) fn fixed(&self) -> Fixed {
        Fixed {
            addend: self.addend,
            indices: self.indices,
        }
    }
}

/// The bf16 results of the 32 codes `c` (`mag` = `c & 0x7F`, no NaN among them) by `table`,
/// as two registers of low and high bytes in code order.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn bytes_of(c: __m256i, mag: __m256i, table: &Table) -> (__m256i, __m256i) {
    bytes_with(c, mag, table, &table.fixed())
}

/// [`bytes_of`] with the format's registers given (`fixed`, of a table of the same format).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn bytes_with(
    c: __m256i,
    mag: __m256i,
    table: &Table,
    fixed: &Fixed,
) -> (__m256i, __m256i) {
    let [nl, nh] = table.normal;
    let [sl, sh] = table.sub;
    let normal = _mm256_sub_epi8(mag, fixed.indices[0]);
    let sub = _mm256_add_epi8(mag, fixed.indices[1]);
    let lo = _mm256_or_si256(
        _mm256_shuffle_epi8(nl, normal),
        _mm256_shuffle_epi8(sl, sub),
    );
    let hi = _mm256_or_si256(
        _mm256_shuffle_epi8(nh, normal),
        _mm256_shuffle_epi8(sh, sub),
    );
    // Bytes shifted by four within 16-bit lanes: the low nibble is the byte's own high one.
    let top = _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi8(0x0F));
    (
        lo,
        _mm256_add_epi8(hi, _mm256_shuffle_epi8(fixed.addend, top)),
    )
}

/// The 32 codes at `src` and their magnitudes, and whether one of them is above `finite` (the
/// largest finite magnitude in every byte, [`Fp8::finite`]): a NaN or an infinity, which the
/// tables do not cover.
///
/// # Safety
/// The 32 bytes at `src` are readable.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn load_codes(src: *const u8, finite: __m256i) -> (__m256i, __m256i, bool) {
    // SAFETY: the caller's contract; loadu has no alignment requirement.
    let c = unsafe { _mm256_loadu_si256(src.cast()) };
    let mag = _mm256_and_si256(c, _mm256_set1_epi8(0x7F));
    // Magnitudes are below 0x80, so the signed compare is the unsigned one.
    let special = _mm256_cmpgt_epi8(mag, finite);
    (c, mag, _mm256_movemask_epi8(special) != 0)
}

/// Interleaves 32 low and high bytes into the 64 bytes at `d`.
///
/// # Safety
/// The 64 bytes at `d` are writable, and 32-byte aligned when streaming.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn store_64(d: *mut u8, lo: __m256i, hi: __m256i, stores: Stores) {
    // Byte unpacks work within 128-bit halves: a = codes 0-7 | 16-23, b = 8-15 | 24-31.
    let a = _mm256_unpacklo_epi8(lo, hi);
    let b = _mm256_unpackhi_epi8(lo, hi);
    // SAFETY: the caller's contract.
    unsafe {
        store(d, _mm256_permute2x128_si256(a, b, 0x20), stores);
        store(d.add(32), _mm256_permute2x128_si256(a, b, 0x31), stores);
    }
}

/// The results of 32 codes whose first `before` take table `a` and the rest table `b` (a step
/// across a tile edge looks up both tables and takes each code from its own); `None` for a NaN
/// code or a tile without a table.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn step(
    codes: (__m256i, __m256i, bool),
    a: Option<&Table>,
    b: Option<&Table>,
    before: usize,
) -> Option<(__m256i, __m256i)> {
    let (c, mag, nan) = codes;
    let (a, b) = (a?, b?);
    if nan {
        return None;
    }
    let (lo, hi) = bytes_of(c, mag, a);
    if before >= 32 {
        return Some((lo, hi));
    }
    let iota = _mm256_setr_epi8(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
        25, 26, 27, 28, 29, 30, 31,
    );
    let (lo_b, hi_b) = bytes_of(c, mag, b);
    let first = _mm256_cmpgt_epi8(_mm256_set1_epi8(before as i8), iota);
    Some((
        _mm256_blendv_epi8(lo_b, lo, first),
        _mm256_blendv_epi8(hi_b, hi, first),
    ))
}

/// The tables of the 32 codes at column `i` of a row of `block`-code tiles (at least 32) and
/// how many of them are before the tile edge (32: none is after it), as [`step`] takes them.
pub(crate) fn tiles_at(
    tables: &[Option<Table>],
    i: usize,
    block: usize,
) -> (Option<&Table>, Option<&Table>, usize) {
    let (t0, t1) = (i / block, (i + 31) / block);
    let table = |t: usize| tables.get(t).and_then(Option::as_ref);
    let before = if t1 == t0 { 32 } else { t1 * block - i };
    (table(t0), table(t1), before)
}
