//! CPU reduction kernels: `dst = dst op src`, element-wise, for every [`DType`] and
//! [`ReduceOp`].
//!
//! Each (type, op) pair is a plain loop over two slices with a branch-free element
//! function, so the compiler vectorizes it. bf16 and f16 widen to f32, combine and
//! round back to nearest-even; bf16 rounding is branch-free and vectorizes too.
//! Semantics (NaN, overflow, `Avg`) are documented on [`ReduceOp`].

use crate::{DType, KernelError, ReduceOp};
use bytemuck::Pod;
use half::{bf16, f16};

/// An element type the kernels can reduce.
pub trait Element: Pod + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// `dst[i] = dst[i] op src[i]` for equal-length slices (`Avg` combines as `Sum`).
    fn reduce_slice(op: ReduceOp, dst: &mut [Self], src: &[Self]);
    /// `buf[i] = buf[i] / n` (the `Avg` finalization); `n > 0`.
    fn divide_slice(buf: &mut [Self], n: u32);
}

#[inline(always)]
fn zip_apply<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn reduce_slice(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip_apply(dst, src, <$t>::wrapping_add),
                    ReduceOp::Prod => zip_apply(dst, src, <$t>::wrapping_mul),
                    ReduceOp::Min => zip_apply(dst, src, |a, b| if b < a { b } else { a }),
                    ReduceOp::Max => zip_apply(dst, src, |a, b| if b > a { b } else { a }),
                }
            }
            fn divide_slice(buf: &mut [Self], n: u32) {
                // n fits every integer type's positive range for realistic rank counts;
                // wider counts saturate to the type's maximum divisor.
                let n = <$t>::try_from(n).unwrap_or(<$t>::MAX);
                for x in buf {
                    *x /= n;
                }
            }
        }
    };
}

int_element!(i8, DType::I8);
int_element!(u8, DType::U8);
int_element!(i32, DType::I32);
int_element!(u32, DType::U32);
int_element!(i64, DType::I64);
int_element!(u64, DType::U64);

/// NaN-propagating minimum: `a + b` is NaN exactly when either input is.
macro_rules! float_min {
    ($a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        let m = if b < a { b } else { a };
        if a.is_nan() || b.is_nan() {
            a + b
        } else {
            m
        }
    }};
}

macro_rules! float_max {
    ($a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        let m = if b > a { b } else { a };
        if a.is_nan() || b.is_nan() {
            a + b
        } else {
            m
        }
    }};
}

macro_rules! float_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn reduce_slice(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip_apply(dst, src, |a, b| a + b),
                    ReduceOp::Prod => zip_apply(dst, src, |a, b| a * b),
                    ReduceOp::Min => zip_apply(dst, src, |a, b| float_min!(a, b)),
                    ReduceOp::Max => zip_apply(dst, src, |a, b| float_max!(a, b)),
                }
            }
            fn divide_slice(buf: &mut [Self], n: u32) {
                let n = n as $t;
                for x in buf {
                    *x /= n;
                }
            }
        }
    };
}

float_element!(f32, DType::F32);
float_element!(f64, DType::F64);

/// bf16 to f32: exact, a shift.
#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// f32 to bf16, round to nearest even; NaN stays NaN (quietened). Branch-free.
#[inline(always)]
fn f32_to_bf16(x: f32) -> bf16 {
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    let rounded = (bits.wrapping_add(0x7fff + lsb) >> 16) as u16;
    let nan = ((bits >> 16) as u16) | 0x0040;
    bf16::from_bits(if x.is_nan() { nan } else { rounded })
}

macro_rules! half_element {
    ($t:ty, $d:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn reduce_slice(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                let to = $to;
                let from = $from;
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => zip_apply(dst, src, |a, b| from(to(a) + to(b))),
                    ReduceOp::Prod => zip_apply(dst, src, |a, b| from(to(a) * to(b))),
                    ReduceOp::Min => zip_apply(dst, src, |a, b| from(float_min!(to(a), to(b)))),
                    ReduceOp::Max => zip_apply(dst, src, |a, b| from(float_max!(to(a), to(b)))),
                }
            }
            fn divide_slice(buf: &mut [Self], n: u32) {
                let n = n as f32;
                let to = $to;
                let from = $from;
                for x in buf {
                    *x = from(to(*x) / n);
                }
            }
        }
    };
}

half_element!(bf16, DType::Bf16, bf16_to_f32, f32_to_bf16);
half_element!(f16, DType::F16, f16::to_f32, f16::from_f32);

/// `dst[i] = dst[i] op src[i]` on typed slices.
pub fn reduce<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) -> Result<(), KernelError> {
    if dst.len() != src.len() {
        return Err(KernelError::LengthMismatch { dst: std::mem::size_of_val(dst), src: std::mem::size_of_val(src) });
    }
    T::reduce_slice(op, dst, src);
    Ok(())
}

/// Elements per block on the unaligned path.
const BLOCK: usize = 512;

fn reduce_bytes_typed<T: Element>(op: ReduceOp, dst: &mut [u8], src: &[u8]) {
    if let (Ok(d), Ok(s)) = (bytemuck::try_cast_slice_mut::<u8, T>(dst), bytemuck::try_cast_slice::<u8, T>(src)) {
        T::reduce_slice(op, d, s);
        return;
    }
    // Unaligned: stage blocks through aligned stack buffers.
    let size = std::mem::size_of::<T>();
    let mut a = [T::zeroed(); BLOCK];
    let mut b = [T::zeroed(); BLOCK];
    for (dc, sc) in dst.chunks_mut(BLOCK * size).zip(src.chunks(BLOCK * size)) {
        let n = dc.len() / size;
        bytemuck::cast_slice_mut::<T, u8>(&mut a[..n]).copy_from_slice(dc);
        bytemuck::cast_slice_mut::<T, u8>(&mut b[..n]).copy_from_slice(sc);
        T::reduce_slice(op, &mut a[..n], &b[..n]);
        dc.copy_from_slice(bytemuck::cast_slice(&a[..n]));
    }
}

fn divide_bytes_typed<T: Element>(buf: &mut [u8], n: u32) {
    if let Ok(d) = bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        T::divide_slice(d, n);
        return;
    }
    let size = std::mem::size_of::<T>();
    let mut a = [T::zeroed(); BLOCK];
    for dc in buf.chunks_mut(BLOCK * size) {
        let k = dc.len() / size;
        bytemuck::cast_slice_mut::<T, u8>(&mut a[..k]).copy_from_slice(dc);
        T::divide_slice(&mut a[..k], n);
        dc.copy_from_slice(bytemuck::cast_slice(&a[..k]));
    }
}

fn check_lengths(dtype: DType, dst: usize, src: usize) -> Result<(), KernelError> {
    if dst != src {
        return Err(KernelError::LengthMismatch { dst, src });
    }
    if !dst.is_multiple_of(dtype.size()) {
        return Err(KernelError::PartialElement { len: dst, dtype, size: dtype.size() });
    }
    Ok(())
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::I8 => $f::<i8>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::U32 => $f::<u32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::U64 => $f::<u64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::Bf16 => $f::<bf16>($($arg),*),
        }
    };
}

/// `dst = dst op src` over byte buffers holding `dtype` elements. Any alignment works;
/// aligned buffers take the vectorized path directly.
pub fn reduce_bytes(dtype: DType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
    check_lengths(dtype, dst.len(), src.len())?;
    dispatch!(dtype, reduce_bytes_typed, op, dst, src);
    Ok(())
}

/// Finish an `Avg` reduction over `nranks` ranks: divide every element by `nranks`.
pub fn finalize_avg_bytes(dtype: DType, buf: &mut [u8], nranks: u32) -> Result<(), KernelError> {
    check_lengths(dtype, buf.len(), buf.len())?;
    if nranks == 0 {
        return Err(KernelError::ZeroDivisor);
    }
    dispatch!(dtype, divide_bytes_typed, buf, nranks);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let samples = [
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            3.4e38,
            -3.4e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            f32::MIN_POSITIVE,
            65504.0,
            0.1,
        ];
        for &x in &samples {
            assert_eq!(f32_to_bf16(x).to_bits(), bf16::from_f32(x).to_bits(), "{x}");
        }
        for bits in (0u32..=u32::MAX).step_by(65_521) {
            let x = f32::from_bits(bits);
            if x.is_nan() {
                assert!(bf16_to_f32(f32_to_bf16(x)).is_nan());
            } else {
                assert_eq!(f32_to_bf16(x).to_bits(), bf16::from_f32(x).to_bits(), "{bits:#x}");
            }
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let mut d = [0u8; 8];
        assert_eq!(
            reduce_bytes(DType::F32, ReduceOp::Sum, &mut d, &[0u8; 4]),
            Err(KernelError::LengthMismatch { dst: 8, src: 4 })
        );
        assert!(matches!(
            reduce_bytes(DType::F64, ReduceOp::Sum, &mut d[..6], &[0u8; 6]),
            Err(KernelError::PartialElement { len: 6, .. })
        ));
        assert_eq!(finalize_avg_bytes(DType::U8, &mut d, 0), Err(KernelError::ZeroDivisor));
    }
}
