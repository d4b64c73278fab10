//! `trash_panda.Tier`: where a block's weights live between uses, the core's `Tier` as a Python
//! enum class. A tier crosses the binding as this class; a name ("ram", "vram", ...) given by a
//! user is parsed once, here, with the core's rule and its list of accepted names.

use pyo3::prelude::*;
use pyo3::types::PyString;

use trash_panda::plan::Tier;

use crate::errors::{raise, Kind, ToPyErr};
use crate::mirror::mirror_enum;

/// Where a block's weights live between uses: on the compute device, in host RAM, or on disk.
#[pyclass(name = "Tier", module = "trash_panda._core", eq, eq_int, frozen, hash)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub(crate) enum PyTier {
    /// Resident on the compute device (the GPU, or the CPU's RAM when there is no GPU).
    DEVICE,
    /// Kept in host RAM and copied to the device ahead of use.
    RAM,
    /// Read from the checkpoint file ahead of use.
    DISK,
}

mirror_enum!(PyTier <=> Tier {
    DEVICE = Device,
    RAM = Ram,
    DISK = Disk,
});

#[pymethods]
impl PyTier {
    /// The tier named `name`: "device", "ram", "disk", or an alias the core accepts ("gpu",
    /// "cuda", "vram", "cpu", "memory"); a PlanError naming them otherwise.
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        Ok(name.parse::<Tier>().map_err(ToPyErr::to_py)?.into())
    }

    /// The device tier by the name it has when the device is a GPU.
    #[classattr]
    #[allow(non_snake_case)]
    fn GPU() -> Self {
        PyTier::DEVICE
    }

    /// The tier's own name, lower-case, as plans, logs and options write it.
    #[getter]
    fn value(&self) -> &'static str {
        Tier::from(*self).name()
    }

    fn __str__(&self) -> &'static str {
        Tier::from(*self).name()
    }
}

/// A tier argument: a `Tier`, or a name parsed once here.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TierArg(pub(crate) Tier);

impl<'a, 'py> FromPyObject<'a, 'py> for TierArg {
    type Error = PyErr;

    fn extract(value: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(t) = value.extract::<PyTier>() {
            return Ok(TierArg(t.into()));
        }
        if let Ok(name) = value.cast::<PyString>() {
            return Ok(TierArg(
                name.to_str()?.parse::<Tier>().map_err(ToPyErr::to_py)?,
            ));
        }
        Err(raise(
            Kind::Argument,
            format!(
                "tier: expected a Tier or a tier name such as \"ram\", got {}",
                value.get_type().name()?
            ),
        ))
    }
}
