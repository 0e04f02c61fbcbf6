//! Reduction kernels against a straightforward scalar reference, for every dtype and op.
//!
//! The reference computes each element in a wider type (f64 for floats, i128 for
//! integers) and rounds or wraps once; double rounding is innocuous at these widths, so
//! float results must match bit for bit (NaN matches NaN; +0 matches -0 only for min/max).
#![allow(clippy::unwrap_used, reason = "test helpers panic on broken invariants; that is a test failure")]

use half::{bf16, f16};
use proptest::prelude::*;
use r2ccl_core::kernels::{finalize_avg_bytes, reduce_bytes};
use r2ccl_core::{DType, ReduceOp};

fn int_ref(op: ReduceOp, a: i128, b: i128) -> i128 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a.wrapping_mul(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    }
}

fn float_ref(op: ReduceOp, a: f64, b: f64) -> f64 {
    if (op == ReduceOp::Min || op == ReduceOp::Max) && (a.is_nan() || b.is_nan()) {
        return f64::NAN;
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    }
}

/// Decode element `i` of `buf` as f64 (floats) or i128 (ints).
enum Val {
    I(i128),
    F(f64),
}

fn load(d: DType, b: &[u8]) -> Val {
    match d {
        DType::I8 => Val::I(i128::from(b[0] as i8)),
        DType::U8 => Val::I(i128::from(b[0])),
        DType::I32 => Val::I(i128::from(i32::from_le_bytes(b.try_into().unwrap()))),
        DType::U32 => Val::I(i128::from(u32::from_le_bytes(b.try_into().unwrap()))),
        DType::I64 => Val::I(i128::from(i64::from_le_bytes(b.try_into().unwrap()))),
        DType::U64 => Val::I(i128::from(u64::from_le_bytes(b.try_into().unwrap()))),
        DType::F16 => Val::F(f16::from_le_bytes(b.try_into().unwrap()).to_f64()),
        DType::Bf16 => Val::F(bf16::from_le_bytes(b.try_into().unwrap()).to_f64()),
        DType::F32 => Val::F(f64::from(f32::from_le_bytes(b.try_into().unwrap()))),
        DType::F64 => Val::F(f64::from_le_bytes(b.try_into().unwrap())),
    }
}

fn store(d: DType, v: Val) -> Vec<u8> {
    match (d, v) {
        (DType::I8 | DType::U8, Val::I(x)) => vec![x as u8],
        (DType::I32 | DType::U32, Val::I(x)) => (x as u32).to_le_bytes().to_vec(),
        (DType::I64 | DType::U64, Val::I(x)) => (x as u64).to_le_bytes().to_vec(),
        (DType::F16, Val::F(x)) => {
            round_nearest_even(x, f16::from_f64(x).to_bits(), |b| f16::from_bits(b).to_f64(), 65520.0, 0x7c00)
                .to_le_bytes()
                .to_vec()
        }
        (DType::Bf16, Val::F(x)) => round_nearest_even(
            x,
            bf16::from_f64(x).to_bits(),
            |b| bf16::from_bits(b).to_f64(),
            3.3961775292304e38,
            0x7f80,
        )
        .to_le_bytes()
        .to_vec(),
        (DType::F32, Val::F(x)) => (x as f32).to_le_bytes().to_vec(),
        (DType::F64, Val::F(x)) => x.to_le_bytes().to_vec(),
        _ => unreachable!("type and value class always agree"),
    }
}

/// Correct round-to-nearest-even of `x` to a 16-bit float, independent of library
/// conversions (half's f64 conversion was seen to round 0.4995 ulp up): take the guess and its
/// two neighbours and keep the nearest, ties to an even bit pattern. `overflow` is the
/// magnitude from which the result is infinite; `inf` the infinity's bit pattern.
fn round_nearest_even(x: f64, guess: u16, value: impl Fn(u16) -> f64, overflow: f64, inf: u16) -> u16 {
    if !x.is_finite() || x.is_nan() {
        return guess;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    if x.abs() >= overflow {
        return sign | inf;
    }
    let mag = guess & 0x7fff;
    let cands = [mag.saturating_sub(1), mag, (mag + 1).min(inf - 1)];
    let mut best = mag;
    let mut best_d = f64::INFINITY;
    for c in cands {
        let d = (x.abs() - value(c)).abs();
        if d < best_d || (d == best_d && c % 2 == 0) {
            best = c;
            best_d = d;
        }
    }
    if best == 0 {
        // Keep the sign of zero the way IEEE addition does (x is an exact sum here).
        return if x == 0.0 { guess } else { sign };
    }
    sign | best
}

fn reference(d: DType, op: ReduceOp, dst: &[u8], src: &[u8]) -> Vec<u8> {
    let s = d.size();
    let mut out = Vec::with_capacity(dst.len());
    for (a, b) in dst.chunks(s).zip(src.chunks(s)) {
        let v = match (load(d, a), load(d, b)) {
            (Val::I(x), Val::I(y)) => Val::I(int_ref(op, x, y)),
            (Val::F(x), Val::F(y)) => Val::F(float_ref(op, x, y)),
            _ => unreachable!(),
        };
        out.extend(store(d, v));
    }
    out
}

fn same(d: DType, op: ReduceOp, got: &[u8], want: &[u8]) -> bool {
    let s = d.size();
    got.chunks(s).zip(want.chunks(s)).all(|(g, w)| match (load(d, g), load(d, w)) {
        (Val::I(x), Val::I(y)) => x == y,
        (Val::F(x), Val::F(y)) => {
            if x.is_nan() || y.is_nan() {
                x.is_nan() && y.is_nan()
            } else if x == 0.0 && y == 0.0 && matches!(op, ReduceOp::Min | ReduceOp::Max) {
                true
            } else {
                g == w
            }
        }
        _ => false,
    })
}

fn special_bytes(d: DType) -> Vec<Vec<u8>> {
    match d {
        DType::F32 => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -0.0, 1e-45]
            .iter()
            .map(|x| x.to_le_bytes().to_vec())
            .collect(),
        DType::F64 => [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, -0.0, 5e-324]
            .iter()
            .map(|x| x.to_le_bytes().to_vec())
            .collect(),
        DType::F16 => [f16::NAN, f16::INFINITY, f16::NEG_INFINITY, f16::MAX, f16::NEG_ZERO]
            .iter()
            .map(|x| x.to_le_bytes().to_vec())
            .collect(),
        DType::Bf16 => [bf16::NAN, bf16::INFINITY, bf16::NEG_INFINITY, bf16::MAX, bf16::NEG_ZERO]
            .iter()
            .map(|x| x.to_le_bytes().to_vec())
            .collect(),
        DType::I8 => vec![vec![0x7f], vec![0x80]],
        DType::U8 => vec![vec![0xff], vec![0]],
        DType::I32 | DType::U32 => {
            vec![i32::MAX.to_le_bytes().to_vec(), i32::MIN.to_le_bytes().to_vec(), vec![0xff; 4]]
        }
        DType::I64 | DType::U64 => {
            vec![i64::MAX.to_le_bytes().to_vec(), i64::MIN.to_le_bytes().to_vec(), vec![0xff; 8]]
        }
    }
}

fn case() -> impl Strategy<Value = (DType, ReduceOp, usize, usize, Vec<u8>, Vec<u8>)> {
    (0usize..10, 0usize..5, 0usize..200, 0usize..8).prop_flat_map(|(d, o, n, off)| {
        let d = DType::ALL[d];
        let bytes = n * d.size();
        (
            Just(d),
            Just(ReduceOp::ALL[o]),
            Just(n),
            Just(off),
            prop::collection::vec(any::<u8>(), bytes),
            prop::collection::vec(any::<u8>(), bytes),
        )
    })
}

/// Replace every 7th element with a special value so NaN/inf/overflow show up often.
fn sprinkle(d: DType, buf: &mut [u8], salt: usize) {
    let sp = special_bytes(d);
    for (i, e) in buf.chunks_mut(d.size()).enumerate() {
        if (i + salt).is_multiple_of(7) {
            e.copy_from_slice(&sp[(i / 7 + salt) % sp.len()]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn kernel_matches_reference((d, op, n, off, mut a, mut b) in case()) {
        sprinkle(d, &mut a, 0);
        sprinkle(d, &mut b, 3);
        let want = reference(d, op, &a, &b);
        // Place the destination at an arbitrary byte offset to exercise unaligned input.
        let mut storage = vec![0u8; a.len() + off];
        storage[off..].copy_from_slice(&a);
        let mut src_storage = vec![0u8; b.len() + (off + 3) % 8];
        let soff = (off + 3) % 8;
        src_storage[soff..].copy_from_slice(&b);
        reduce_bytes(d, op, &mut storage[off..], &src_storage[soff..]).unwrap();
        let s = d.size();
        let bad = storage[off..].chunks(s).zip(want.chunks(s)).zip(a.chunks(s).zip(b.chunks(s)))
            .find(|((g, w), _)| !same(d, op, g, w));
        prop_assert!(bad.is_none(), "{d} {op} n={n} off={off}: (got, want), (a, b) = {bad:?}");
    }

    #[test]
    fn avg_divides_after_sum((d, _op, n, off, a, _b) in case(), k in 1u32..9) {
        let mut storage = vec![0u8; a.len() + off];
        storage[off..].copy_from_slice(&a);
        finalize_avg_bytes(d, &mut storage[off..], k).unwrap();
        let s = d.size();
        for (i, (g, x)) in storage[off..].chunks(s).zip(a.chunks(s)).enumerate() {
            let want = match load(d, x) {
                Val::I(v) => store(d, Val::I(v / i128::from(k))),
                Val::F(v) => store(d, Val::F(v / f64::from(k))),
            };
            prop_assert!(same(d, ReduceOp::Sum, g, &want), "{d} n={n} i={i}");
        }
    }
}

#[test]
fn lengths_zero_one_and_odd() {
    for d in DType::ALL {
        for op in ReduceOp::ALL {
            for n in [0usize, 1, 3, 17, 1023] {
                let a: Vec<u8> = (0..n * d.size()).map(|i| (i * 37 % 251) as u8 & 0x3f).collect();
                let b: Vec<u8> = (0..n * d.size()).map(|i| (i * 11 % 241) as u8 & 0x3f).collect();
                let want = reference(d, op, &a, &b);
                let mut got = a.clone();
                reduce_bytes(d, op, &mut got, &b).unwrap();
                assert!(same(d, op, &got, &want), "{d} {op} n={n}");
            }
        }
    }
}

#[test]
fn integer_overflow_wraps() {
    let mut a = [127u8, 255];
    reduce_bytes(DType::I8, ReduceOp::Sum, &mut a[..1], &[1]).unwrap();
    assert_eq!(a[0] as i8, -128);
    reduce_bytes(DType::U8, ReduceOp::Prod, &mut a[1..], &[2]).unwrap();
    assert_eq!(a[1], 254);
    let mut x = i64::MAX.to_le_bytes();
    reduce_bytes(DType::I64, ReduceOp::Sum, &mut x, &1i64.to_le_bytes()).unwrap();
    assert_eq!(i64::from_le_bytes(x), i64::MIN);
    let mut avg = (-7i32).to_le_bytes();
    finalize_avg_bytes(DType::I32, &mut avg, 2).unwrap();
    assert_eq!(i32::from_le_bytes(avg), -3, "integer avg truncates toward zero");
}

#[test]
fn nan_and_infinity_semantics() {
    let mut a = [f32::NAN, 1.0, f32::INFINITY, f32::INFINITY];
    let b = [1.0, f32::NAN, f32::NEG_INFINITY, 1.0];
    let bytes_a: &mut [u8] = bytemuck_cast(&mut a);
    reduce_bytes(DType::F32, ReduceOp::Min, bytes_a, bytemuck_cast_ref(&b)).unwrap();
    assert!(a[0].is_nan() && a[1].is_nan(), "min propagates NaN");
    assert_eq!(a[2], f32::NEG_INFINITY);
    assert_eq!(a[3], 1.0);
    let mut s = [f32::INFINITY];
    reduce_bytes(DType::F32, ReduceOp::Sum, bytemuck_cast(&mut s), bytemuck_cast_ref(&[f32::NEG_INFINITY])).unwrap();
    assert!(s[0].is_nan(), "inf + -inf is NaN");
}

fn bytemuck_cast(x: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(x)
}

fn bytemuck_cast_ref(x: &[f32]) -> &[u8] {
    bytemuck::cast_slice(x)
}
