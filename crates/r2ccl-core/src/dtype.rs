//! Element data types and reduce operations of collectives.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of a collective's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE 754 half precision.
    F16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bf16,
}

impl DType {
    /// Every data type, in a fixed order.
    pub const ALL: [DType; 10] = [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::Bf16,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64 | DType::Bf16)
    }

    /// The name nccl-tests prints for this type (`float`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::F16 => "half",
            DType::F32 => "float",
            DType::F64 => "double",
            DType::Bf16 => "bfloat16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown data type or reduce op name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}`; allowed: {allowed}")]
pub struct ParseNameError {
    what: &'static str,
    name: String,
    allowed: &'static str,
}

impl FromStr for DType {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DType::I8,
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" | "int" => DType::I32,
            "uint32" | "u32" => DType::U32,
            "int64" | "i64" => DType::I64,
            "uint64" | "u64" => DType::U64,
            "half" | "f16" | "float16" => DType::F16,
            "float" | "f32" | "float32" => DType::F32,
            "double" | "f64" | "float64" => DType::F64,
            "bfloat16" | "bf16" => DType::Bf16,
            _ => {
                return Err(ParseNameError {
                    what: "data type",
                    name: s.to_owned(),
                    allowed: "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16",
                })
            }
        })
    }
}

/// Reduce operation of AllReduce, Reduce and ReduceScatter.
///
/// Floating-point `Min`/`Max` propagate NaN (a NaN in any input gives NaN). Integer
/// `Sum`/`Prod` wrap on overflow (two's complement), as NCCL does. `Avg` reduces as
/// `Sum` and divides by the number of ranks at the end; for integers the division
/// truncates toward zero after the wrapping sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average over ranks.
    Avg,
}

impl ReduceOp {
    /// Every reduce op.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// The name nccl-tests prints (`sum`, `prod`, `min`, `max`, `avg`).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            _ => return Err(ParseNameError { what: "reduce op", name: s.to_owned(), allowed: "sum prod min max avg" }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
        }
        let e = "float8".parse::<DType>().unwrap_err().to_string();
        assert!(e.contains("float8") && e.contains("bfloat16"), "{e}");
    }
}
