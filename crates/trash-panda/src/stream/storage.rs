//! Which storage dtypes the engine converts the RAM tier to, and the planner's conversion rule
//! ([`storage_conversion`]) applied to the engine's tensors: what the layout places and what the
//! load converts.

use super::{StreamError, StreamTensor};
use crate::rules::{storage_conversion, Conversion, TensorSizes};
use crate::DType;

/// The storage dtypes the engine converts to, for error messages.
pub const STORAGE_DTYPES: &str = "none (as stored), bf16, fp8 (e4m3fn)";

/// The rule of [`storage_conversion`], applied to a staged tensor.
pub(crate) fn conversion(t: &StreamTensor, storage: DType) -> Conversion {
    storage_conversion(
        &TensorSizes::new(t.name.as_str(), t.dtype, &t.shape),
        storage,
    )
}

/// Refuses storage dtypes the engine has no conversion for.
pub(crate) fn check_storage(storage: Option<DType>) -> Result<(), StreamError> {
    match storage {
        None | Some(DType::BF16 | DType::F8E4M3) => Ok(()),
        Some(other) => Err(StreamError::InvalidOptions {
            option: "storage",
            value: other.to_string(),
            expected: STORAGE_DTYPES,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dtype: DType, shape: &[usize]) -> StreamTensor {
        let n: usize = shape.iter().product();
        StreamTensor {
            name: name.into(),
            file: 0,
            start: 0,
            end: (n * dtype.size()) as u64,
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn the_rule_is_the_planners() {
        use Conversion::*;
        let big = [1024, 1024];
        let cases = [
            (t("a.weight", DType::F32, &[8]), Keep, ToBf16),
            (t("a.weight", DType::F64, &[8]), Keep, ToBf16),
            (
                t("a.weight", DType::BF16, &big),
                ToFp8 {
                    rows: 1024,
                    cols: 1024,
                },
                Keep,
            ),
            (t("a.weight", DType::F16, &[1023, 1024]), Keep, Keep),
            (t("a.weight", DType::F32, &[1 << 20]), Keep, ToBf16),
            (t("a.weight", DType::F32, &[2, 512, 1024]), Keep, ToBf16),
            (t("a.weight", DType::F8E5M2, &big), Keep, Keep),
            (t("a.weight", DType::I32, &big), Keep, Keep),
            (t("a.weight_scale", DType::F32, &big), Keep, Keep),
            (t("a.input_scale", DType::F32, &[]), Keep, Keep),
        ];
        for (tensor, fp8, bf16) in cases {
            assert_eq!(conversion(&tensor, DType::F8E4M3), fp8, "{tensor:?}");
            assert_eq!(conversion(&tensor, DType::BF16), bf16, "{tensor:?}");
        }
        assert!(check_storage(None).is_ok() && check_storage(Some(DType::BF16)).is_ok());
        let e = check_storage(Some(DType::F16)).unwrap_err().to_string();
        assert!(
            e.contains("storage = f16") && e.contains(STORAGE_DTYPES),
            "{e}"
        );
    }
}
