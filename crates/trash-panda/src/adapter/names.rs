//! What one tensor name of an adapter file says: which layer it patches, in which naming, and
//! which part of the adapter it is.

/// A part of a layer's adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// LoRA's down matrix (PEFT's `lora_A`): rank x in.
    Down,
    /// LoRA's up matrix (PEFT's `lora_B`): out x rank.
    Up,
    /// The layer's alpha (kohya, LyCORIS): a scalar tensor.
    Alpha,
    /// LoKr's first factor, whole.
    LokrW1,
    /// LoKr's first factor, as `w1_a @ w1_b`: its left matrix.
    LokrW1A,
    /// Its right matrix.
    LokrW1B,
    /// LoKr's second factor, whole.
    LokrW2,
    /// LoKr's second factor as `w2_a @ w2_b`: its left matrix.
    LokrW2A,
    /// Its right matrix.
    LokrW2B,
    /// LoHa's first product's left matrix.
    HadaW1A,
    /// LoHa's first product's right matrix.
    HadaW1B,
    /// LoHa's second product's left matrix.
    HadaW2A,
    /// LoHa's second product's right matrix.
    HadaW2B,
}

impl Part {
    /// The part's short name, one word (`down`, `up`, `alpha`, `lokr_w1`, `hada_w2_b`, ...).
    pub fn key(self) -> &'static str {
        match self {
            Part::Down => "down",
            Part::Up => "up",
            Part::Alpha => "alpha",
            Part::LokrW1 => "lokr_w1",
            Part::LokrW1A => "lokr_w1_a",
            Part::LokrW1B => "lokr_w1_b",
            Part::LokrW2 => "lokr_w2",
            Part::LokrW2A => "lokr_w2_a",
            Part::LokrW2B => "lokr_w2_b",
            Part::HadaW1A => "hada_w1_a",
            Part::HadaW1B => "hada_w1_b",
            Part::HadaW2A => "hada_w2_a",
            Part::HadaW2B => "hada_w2_b",
        }
    }

    /// The part's name as the files spell it (for messages).
    pub fn name(self) -> &'static str {
        match self {
            Part::Down => "lora_down (lora_A)",
            Part::Up => "lora_up (lora_B)",
            other => other.key(),
        }
    }
}

/// How a name gives its layer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A dotted module path (PEFT, diffusers), as in the file: it may start with the pipeline
    /// component's name (`unet.`, `transformer.`) or PEFT's `base_model.model.`.
    Dotted(String),
    /// kohya's form: the module path with every `.` turned into `_`, after a prefix that names
    /// the pipeline component (`lora_unet_`, `lora_te1_`, ...).
    Joined {
        /// The component the prefix names (`unet`, `text_encoder`, `text_encoder_2`, ...).
        component: &'static str,
        /// The joined path after the prefix.
        path: String,
    },
}

/// One tensor name read: its layer and its part.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdapterName {
    /// The layer it patches, as the file names it.
    pub target: Target,
    /// Which part of the layer's adapter it is.
    pub part: Part,
}

/// What reading a name found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// An adapter part this crate applies.
    Part(AdapterName),
    /// An adapter part of a kind not supported yet (`what` says which).
    Unsupported(&'static str),
    /// Not an adapter tensor's name.
    Other,
}

/// kohya's component prefixes, longest first where one starts another.
const JOINED_PREFIXES: [(&str, &str); 7] = [
    ("lora_unet_", "unet"),
    ("lora_transformer_", "transformer"),
    ("lora_te1_", "text_encoder"),
    ("lora_te2_", "text_encoder_2"),
    ("lora_te3_", "text_encoder_3"),
    ("lora_te_", "text_encoder"),
    ("lycoris_", "unet"),
];

/// Part suffixes after the layer's path, most specific first.
const SUFFIXES: [(&str, Part); 19] = [
    (".lora_linear_layer.down.weight", Part::Down),
    (".lora_linear_layer.up.weight", Part::Up),
    (".lora.down.weight", Part::Down),
    (".lora.up.weight", Part::Up),
    (".lora_down.weight", Part::Down),
    (".lora_up.weight", Part::Up),
    (".lora_A.weight", Part::Down),
    (".lora_B.weight", Part::Up),
    (".alpha", Part::Alpha),
    (".lokr_w1_a", Part::LokrW1A),
    (".lokr_w1_b", Part::LokrW1B),
    (".lokr_w2_a", Part::LokrW2A),
    (".lokr_w2_b", Part::LokrW2B),
    (".lokr_w1", Part::LokrW1),
    (".lokr_w2", Part::LokrW2),
    (".hada_w1_a", Part::HadaW1A),
    (".hada_w1_b", Part::HadaW1B),
    (".hada_w2_a", Part::HadaW2A),
    (".hada_w2_b", Part::HadaW2B),
];

/// Parts of adapters that are known but not applied yet, by the text that marks them.
const UNSUPPORTED: [(&str, &str); 8] = [
    (".lora_mid.", "LoCon's Tucker mid matrix (lora_mid)"),
    (".lokr_t2", "LoKr's Tucker core (lokr_t2)"),
    (".hada_t1", "LoHa's Tucker core (hada_t1)"),
    (".hada_t2", "LoHa's Tucker core (hada_t2)"),
    (".dora_scale", "DoRA's magnitude (dora_scale)"),
    (
        ".lora_magnitude_vector",
        "DoRA's magnitude (lora_magnitude_vector)",
    ),
    (
        ".lora_embedding_A",
        "a LoRA on an embedding (lora_embedding_A)",
    ),
    (
        ".lora_embedding_B",
        "a LoRA on an embedding (lora_embedding_B)",
    ),
];

/// Reads one tensor name of an adapter file.
pub fn read_name(name: &str) -> Read {
    for (mark, what) in UNSUPPORTED {
        if name.contains(mark) {
            return Read::Unsupported(what);
        }
    }
    let Some((path, part)) = split_part(name) else {
        return Read::Other;
    };
    if path.is_empty() {
        return Read::Other;
    }
    for (prefix, component) in JOINED_PREFIXES {
        if let Some(rest) = path.strip_prefix(prefix) {
            if !rest.is_empty() && !rest.contains('.') {
                return Read::Part(AdapterName {
                    target: Target::Joined {
                        component,
                        path: rest.to_owned(),
                    },
                    part,
                });
            }
        }
    }
    Read::Part(AdapterName {
        target: Target::Dotted(path.to_owned()),
        part,
    })
}

/// The layer path and the part of `name`. PEFT's in-memory names carry the adapter's name
/// between the part and `weight` (`q_proj.lora_A.default.weight`): read as the part too.
fn split_part(name: &str) -> Option<(&str, Part)> {
    for (suffix, part) in SUFFIXES {
        if let Some(path) = name.strip_suffix(suffix) {
            return Some((path, part));
        }
    }
    let rest = name.strip_suffix(".weight")?;
    let (before, _adapter) = rest.rsplit_once('.')?;
    let (path, part) = before.rsplit_once('.')?;
    let part = match part {
        "lora_A" => Part::Down,
        "lora_B" => Part::Up,
        _ => return None,
    };
    Some((path, part))
}
