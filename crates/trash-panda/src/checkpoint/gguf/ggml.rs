//! GGML's tensor type ids: which [`DType`] each one is, and the names of those this crate does
//! not read (so an error can say "IQ2_XS" rather than "type 17").

use crate::dtype::DType;

/// Ids 0 to 39 in order: the GGML name, and the dtype for the types this crate reads. Ids 4, 5
/// and 31 to 33, 36 to 38 were removed from GGML but old files may still carry them.
const GGML_TYPES: [(&str, Option<DType>); 40] = [
    ("F32", Some(DType::F32)),
    ("F16", Some(DType::F16)),
    ("Q4_0", Some(DType::Q4_0)),
    ("Q4_1", Some(DType::Q4_1)),
    ("Q4_2", None),
    ("Q4_3", None),
    ("Q5_0", Some(DType::Q5_0)),
    ("Q5_1", Some(DType::Q5_1)),
    ("Q8_0", Some(DType::Q8_0)),
    ("Q8_1", None),
    ("Q2_K", Some(DType::Q2K)),
    ("Q3_K", Some(DType::Q3K)),
    ("Q4_K", Some(DType::Q4K)),
    ("Q5_K", Some(DType::Q5K)),
    ("Q6_K", Some(DType::Q6K)),
    ("Q8_K", None),
    ("IQ2_XXS", None),
    ("IQ2_XS", None),
    ("IQ3_XXS", None),
    ("IQ1_S", None),
    ("IQ4_NL", None),
    ("IQ3_S", None),
    ("IQ2_S", None),
    ("IQ4_XS", None),
    ("I8", Some(DType::I8)),
    ("I16", Some(DType::I16)),
    ("I32", Some(DType::I32)),
    ("I64", Some(DType::I64)),
    ("F64", Some(DType::F64)),
    ("IQ1_M", None),
    ("BF16", Some(DType::BF16)),
    ("Q4_0_4_4", None),
    ("Q4_0_4_8", None),
    ("Q4_0_8_8", None),
    ("TQ1_0", None),
    ("TQ2_0", None),
    ("IQ4_NL_4_4", None),
    ("IQ4_NL_4_8", None),
    ("IQ4_NL_8_8", None),
    ("MXFP4", None),
];

/// The dtype of a GGML type id, `None` for a type this crate does not read (or an unknown id).
pub fn ggml_dtype(ggml_type: u32) -> Option<DType> {
    entry(ggml_type).and_then(|(_, d)| d)
}

/// The GGML name of a type id (`"Q4_K"`, `"IQ2_XS"`, ...), `None` for an id GGML never defined.
pub fn ggml_type_name(ggml_type: u32) -> Option<&'static str> {
    entry(ggml_type).map(|(name, _)| name)
}

/// The GGML type id that stores `dtype`, `None` for the dtypes GGUF cannot hold (fp8, the
/// unsigned integers, bool).
pub fn dtype_ggml_type(dtype: DType) -> Option<u32> {
    GGML_TYPES
        .iter()
        .position(|&(_, d)| d == Some(dtype))
        .and_then(|i| u32::try_from(i).ok())
}

fn entry(ggml_type: u32) -> Option<(&'static str, Option<DType>)> {
    usize::try_from(ggml_type)
        .ok()
        .and_then(|i| GGML_TYPES.get(i))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::BLOCK_DTYPES;

    #[test]
    fn supported_ids_match_the_spec() {
        let want = [
            (0, DType::F32),
            (1, DType::F16),
            (2, DType::Q4_0),
            (3, DType::Q4_1),
            (6, DType::Q5_0),
            (7, DType::Q5_1),
            (8, DType::Q8_0),
            (10, DType::Q2K),
            (11, DType::Q3K),
            (12, DType::Q4K),
            (13, DType::Q5K),
            (14, DType::Q6K),
            (24, DType::I8),
            (25, DType::I16),
            (26, DType::I32),
            (27, DType::I64),
            (28, DType::F64),
            (30, DType::BF16),
        ];
        for (id, dtype) in want {
            assert_eq!(ggml_dtype(id), Some(dtype), "{id}");
            assert_eq!(dtype_ggml_type(dtype), Some(id), "{dtype}");
            // The block types' GGML names are their safetensors_name.
            assert_eq!(ggml_type_name(id), Some(dtype.safetensors_name()), "{id}");
        }
        let supported = (0..64).filter(|&id| ggml_dtype(id).is_some()).count();
        assert_eq!(supported, want.len());
        for d in BLOCK_DTYPES {
            assert!(dtype_ggml_type(d).is_some(), "{d}");
        }
        assert_eq!(dtype_ggml_type(DType::F8E4M3), None);
        assert_eq!(dtype_ggml_type(DType::U8), None);
    }

    #[test]
    fn unsupported_ids_have_names() {
        for (id, name) in [
            (9, "Q8_1"),
            (17, "IQ2_XS"),
            (29, "IQ1_M"),
            (39, "MXFP4"),
            (4, "Q4_2"),
        ] {
            assert_eq!(ggml_type_name(id), Some(name));
            assert_eq!(ggml_dtype(id), None);
        }
        assert_eq!(ggml_type_name(40), None);
        assert_eq!(ggml_type_name(u32::MAX), None);
    }
}
