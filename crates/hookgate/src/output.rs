//! What a command prints: its form, and whether stored bodies come with the evidence.

/// The form of a command's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Lines for a person to read.
    Text,
    /// JSON: one object per line for lists, one object for a story.
    Json,
}

impl Format {
    /// The form `--json` asks for.
    pub fn json_if(flag: bool) -> Format {
        if flag { Format::Json } else { Format::Text }
    }
}

/// Whether the stored bodies (escaped, bounded, masked by `redact:`) are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bodies {
    Hidden,
    Shown,
}

impl Bodies {
    /// What `--body` asks for.
    pub fn shown_if(flag: bool) -> Bodies {
        if flag { Bodies::Shown } else { Bodies::Hidden }
    }
}
