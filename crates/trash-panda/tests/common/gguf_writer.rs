//! A small GGUF writer for the tests: whole files laid out as llama.cpp lays them out (tensor
//! data aligned, in the order given, with gaps where asked), and the field-by-field encoder that
//! malformed files are built with. Tensor data is a pattern that tells tensors apart, so a test
//! can check that a range points at the right bytes.

use std::path::Path;

use trash_panda::checkpoint::gguf::{
    ggml_dtype, GgufArray, GgufFile, GgufValue, ALIGNMENT_KEY, DEFAULT_ALIGNMENT,
};

/// Little-endian GGUF fields, appended one by one.
#[derive(Debug, Default, Clone)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// Magic, version and the two counts.
    pub fn start(version: u32, tensors: u64, pairs: u64) -> Enc {
        let mut e = Enc::default();
        e.raw(b"GGUF").u32(version).u64(tensors).u64(pairs);
        e
    }

    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    /// A GGUF string: u64 length, then the bytes.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes_str(s.as_bytes())
    }

    /// A GGUF string of any bytes (UTF-8 or not).
    pub fn bytes_str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).raw(s)
    }

    /// A metadata pair: key, type code, value.
    pub fn pair(&mut self, key: &str, v: &GgufValue) -> &mut Self {
        self.str(key).value(v)
    }

    /// A value with its type code.
    pub fn value(&mut self, v: &GgufValue) -> &mut Self {
        self.u32(v.value_type().code()).payload(v)
    }

    /// A value without its type code.
    pub fn payload(&mut self, v: &GgufValue) -> &mut Self {
        match v {
            GgufValue::U8(x) => self.raw(&x.to_le_bytes()),
            GgufValue::I8(x) => self.raw(&x.to_le_bytes()),
            GgufValue::U16(x) => self.raw(&x.to_le_bytes()),
            GgufValue::I16(x) => self.raw(&x.to_le_bytes()),
            GgufValue::U32(x) => self.raw(&x.to_le_bytes()),
            GgufValue::I32(x) => self.raw(&x.to_le_bytes()),
            GgufValue::F32(x) => self.raw(&x.to_le_bytes()),
            GgufValue::Bool(x) => self.raw(&[u8::from(*x)]),
            GgufValue::String(s) => self.str(s),
            GgufValue::Array(a) => self.array(a),
            GgufValue::U64(x) => self.raw(&x.to_le_bytes()),
            GgufValue::I64(x) => self.raw(&x.to_le_bytes()),
            GgufValue::F64(x) => self.raw(&x.to_le_bytes()),
        }
    }

    /// An array: element type, count, elements.
    pub fn array(&mut self, a: &GgufArray) -> &mut Self {
        self.u32(a.element_type().code()).u64(a.len() as u64);
        for i in 0..a.len() {
            let v = a.get(i).unwrap();
            self.payload(&v);
        }
        self
    }

    /// A tensor info: name, dimension count, dimensions, GGML type, offset.
    pub fn tensor_info(
        &mut self,
        name: &str,
        ne: &[u64],
        ggml_type: u32,
        offset: u64,
    ) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ggml_type).u64(offset)
    }

    /// Zero bytes up to the next multiple of `alignment`.
    pub fn pad_to(&mut self, alignment: u64) -> &mut Self {
        let len = (self.0.len() as u64).next_multiple_of(alignment);
        self.0.resize(len as usize, 0);
        self
    }
}

/// One tensor to write: an offset of `None` is the next aligned offset after the tensors before.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub ggml_type: u32,
    pub ne: Vec<u64>,
    pub offset: Option<u64>,
}

/// A whole GGUF file to write.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    pub version: u32,
    /// The alignment the data is laid out with (`with_alignment` also writes the key).
    pub alignment: u64,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<TensorSpec>,
}

/// What `GgufWriter::write` made, and where it put things.
#[derive(Debug, Clone)]
pub struct Written {
    pub bytes: Vec<u8>,
    pub data_start: u64,
    /// Each tensor's offset in the data section, in the order of `GgufWriter::tensors`.
    pub offsets: Vec<u64>,
    /// Each tensor's bytes.
    pub nbytes: Vec<u64>,
}

/// The biggest file the writer makes: tests write small files, and a wild offset should fail
/// the test, not fill the disk.
const MAX_FILE: u64 = 1 << 26;

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(mut self, key: &str, value: GgufValue) -> Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Lays the data out at `alignment` and writes `general.alignment` (here, among the
    /// metadata).
    pub fn with_alignment(mut self, alignment: u32) -> Self {
        self.alignment = alignment.into();
        self.meta(ALIGNMENT_KEY, GgufValue::U32(alignment))
    }

    pub fn tensor(mut self, name: &str, ggml_type: u32, ne: &[u64]) -> Self {
        self.tensors.push(TensorSpec {
            name: name.to_owned(),
            ggml_type,
            ne: ne.to_vec(),
            offset: None,
        });
        self
    }

    pub fn tensor_at(mut self, name: &str, ggml_type: u32, ne: &[u64], offset: u64) -> Self {
        self.tensors.push(TensorSpec {
            name: name.to_owned(),
            ggml_type,
            ne: ne.to_vec(),
            offset: Some(offset),
        });
        self
    }

    /// The writer that writes `g` back: the same metadata, tensors at the same offsets.
    pub fn from_file(g: &GgufFile) -> Self {
        GgufWriter {
            version: g.version,
            alignment: g.alignment,
            metadata: g.metadata.clone(),
            tensors: g
                .tensors
                .iter()
                .map(|t| TensorSpec {
                    name: t.name.clone(),
                    ggml_type: t.ggml_type,
                    ne: t.ne.clone(),
                    offset: Some(t.offset),
                })
                .collect(),
        }
    }

    /// The file: header, metadata, tensor infos, padding, then each tensor's data (the pattern
    /// of `fill`). The file ends with the last tensor's last byte (or with the padding when no
    /// tensor has data past it), so that any shorter prefix of it is a cut-off file.
    pub fn write(&self) -> Written {
        let mut offsets = Vec::new();
        let mut nbytes = Vec::new();
        let mut next = 0u64;
        for t in &self.tensors {
            let n = tensor_bytes(t.ggml_type, &t.ne);
            let offset = t.offset.unwrap_or(next.next_multiple_of(self.alignment));
            next = next.max(offset.saturating_add(n));
            offsets.push(offset);
            nbytes.push(n);
        }

        let mut e = Enc::start(
            self.version,
            self.tensors.len() as u64,
            self.metadata.len() as u64,
        );
        for (k, v) in &self.metadata {
            e.pair(k, v);
        }
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            e.tensor_info(&t.name, &t.ne, t.ggml_type, offset);
        }
        e.pad_to(self.alignment);
        let data_start = e.0.len() as u64;
        let len = data_start.saturating_add(next);
        assert!(
            len <= MAX_FILE,
            "test writer: a file of {len} bytes is too large"
        );
        e.0.resize(len as usize, 0);
        for (k, (&offset, &n)) in offsets.iter().zip(&nbytes).enumerate() {
            let start = (data_start + offset) as usize;
            for (i, b) in e.0[start..start + n as usize].iter_mut().enumerate() {
                *b = fill(k, i);
            }
        }
        Written {
            bytes: e.0,
            data_start,
            offsets,
            nbytes,
        }
    }

    pub fn write_to(&self, path: &Path) -> Written {
        let w = self.write();
        std::fs::write(path, &w.bytes).unwrap();
        w
    }
}

/// Byte `i` of tensor number `k`'s data.
pub fn fill(k: usize, i: usize) -> u8 {
    (k.wrapping_mul(37).wrapping_add(i).wrapping_add(1) % 251) as u8
}

/// Bytes of a tensor of this GGML type; 0 for a type the crate does not read (the reader
/// refuses such a tensor before it looks at its data) or a shape that overflows.
pub fn tensor_bytes(ggml_type: u32, ne: &[u64]) -> u64 {
    let Some(dtype) = ggml_dtype(ggml_type) else {
        return 0;
    };
    ne.iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| dtype.bytes_for(n))
        .unwrap_or(0)
}
