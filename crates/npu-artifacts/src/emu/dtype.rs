//! [`DType`]: element types of emulated buffers.

use crate::ArtifactError;
use std::fmt;
use std::str::FromStr;

/// Element types of emulated buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Unsigned 8-bit.
    U8,
    /// Signed 8-bit.
    I8,
    /// Signed 16-bit.
    I16,
    /// Signed 32-bit.
    I32,
    /// Unsigned 32-bit.
    U32,
    /// IEEE single precision.
    F32,
    /// bfloat16.
    Bf16,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 7] = [
        Self::U8,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::U32,
        Self::F32,
        Self::Bf16,
    ];

    /// Size of one element in bytes.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::U8 | Self::I8 => 1,
            Self::I16 | Self::Bf16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
        }
    }

    /// Name (`u8`, `i8`, `i16`, `i32`, `u32`, `f32`, `bf16`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }

    /// Code stored in `main.pdi` (1..=7).
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::U8 => 1,
            Self::I8 => 2,
            Self::I16 => 3,
            Self::I32 => 4,
            Self::U32 => 5,
            Self::F32 => 6,
            Self::Bf16 => 7,
        }
    }

    /// The dtype a code stands for.
    #[must_use]
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Whether this is a floating-point type.
    #[must_use]
    pub fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::Bf16)
    }

    /// The inclusive range of integers the type holds exactly (floats: ±2^24).
    #[must_use]
    pub fn exact_integer_range(self) -> (i64, i64) {
        match self {
            Self::U8 => (0, 0xFF),
            Self::I8 => (-0x80, 0x7F),
            Self::I16 => (-0x8000, 0x7FFF),
            Self::I32 => (-0x8000_0000, 0x7FFF_FFFF),
            Self::U32 => (0, 0xFFFF_FFFF),
            Self::F32 | Self::Bf16 => (-(1 << 24), 1 << 24),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = ArtifactError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let alias = match lower.as_str() {
            "uint8" => "u8",
            "int8" => "i8",
            "int16" => "i16",
            "int32" => "i32",
            "uint32" => "u32",
            "float32" | "float" => "f32",
            "bfloat16" => "bf16",
            other => other,
        };
        Self::ALL
            .into_iter()
            .find(|d| d.name() == alias)
            .ok_or_else(|| ArtifactError::Emu {
                detail: format!(
                    "unknown dtype {s:?}; expected one of {}",
                    Self::ALL.map(DType::name).join(", ")
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(DType::from_code(8), None);
        assert_eq!("int16".parse::<DType>().unwrap(), DType::I16);
        assert_eq!("BF16".parse::<DType>().unwrap(), DType::Bf16);
        assert_eq!(
            "f16".parse::<DType>().unwrap_err().to_string(),
            "emulated design: unknown dtype \"f16\"; expected one of u8, i8, i16, i32, u32, f32, bf16"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::Bf16.size(), 2);
        assert_eq!(DType::U32.size(), 4);
        assert_eq!(DType::I8.size(), 1);
    }
}
