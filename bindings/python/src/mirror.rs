//! `mirror_enum!`: the two conversions between a core enum and the binding's enum class that
//! mirrors it, variant for variant, so a value crosses the binding typed and never as a name.

/// `mirror_enum!(PyTier <=> Tier { DEVICE = Device, RAM = Ram })`: `From` both ways. A variant
/// added to either side without the other fails to compile (the matches are exhaustive).
macro_rules! mirror_enum {
    ($py:ident <=> $core:ty { $($py_variant:ident = $core_variant:ident),+ $(,)? }) => {
        impl From<$core> for $py {
            fn from(value: $core) -> Self {
                match value {
                    $(<$core>::$core_variant => $py::$py_variant,)+
                }
            }
        }

        impl From<$py> for $core {
            fn from(value: $py) -> Self {
                match value {
                    $($py::$py_variant => <$core>::$core_variant,)+
                }
            }
        }
    };
}

pub(crate) use mirror_enum;
