//! Shared helpers of the integration tests: input generation and the sequential reference.
#![allow(dead_code, reason = "each test file uses a different subset")]

use half::{bf16, f16};
use r2ccl_algo::{Collective, ExecOrder, Fabric, RankSchedule, ScheduleRequest};
use r2ccl_core::kernels::{finalize_avg_bytes, reduce_bytes};
use r2ccl_core::{DType, ReduceOp};

/// A small integer for (seed, rank, element): exact in every dtype and every partial sum.
pub fn small(seed: u64, rank: usize, i: usize, op: ReduceOp) -> i64 {
    let mut h =
        seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    h ^= h >> 29;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 32;
    match op {
        ReduceOp::Prod => [1, -1, 1][(h % 3) as usize],
        _ => (h % 7) as i64 - 3,
    }
}

/// Encode `v` as one element of `dtype` (unsigned types shift by 3).
pub fn encode(dtype: DType, v: i64, out: &mut Vec<u8>) {
    match dtype {
        DType::I8 => out.extend((v as i8).to_le_bytes()),
        DType::U8 => out.extend(((v + 3) as u8).to_le_bytes()),
        DType::I32 => out.extend((v as i32).to_le_bytes()),
        DType::U32 => out.extend(((v + 3) as u32).to_le_bytes()),
        DType::I64 => out.extend(v.to_le_bytes()),
        DType::U64 => out.extend(((v + 3) as u64).to_le_bytes()),
        DType::F16 => out.extend(f16::from_f32(v as f32).to_le_bytes()),
        DType::Bf16 => out.extend(bf16::from_f32(v as f32).to_le_bytes()),
        DType::F32 => out.extend((v as f32).to_le_bytes()),
        DType::F64 => out.extend((v as f64).to_le_bytes()),
    }
}

/// Every rank's input buffer for `req` with `p` ranks.
pub fn inputs(req: &ScheduleRequest, p: usize, seed: u64) -> Vec<Vec<u8>> {
    let (in_len, _) = req.buffer_lens(p).unwrap();
    let n = in_len as usize / req.dtype.size();
    (0..p)
        .map(|r| {
            let mut v = Vec::with_capacity(in_len as usize);
            for i in 0..n {
                encode(req.dtype, small(seed, r, i, req.collective.op()), &mut v);
            }
            v
        })
        .collect()
}

fn reduce_all(dtype: DType, op: ReduceOp, bufs: &[&[u8]]) -> Vec<u8> {
    let mut acc = bufs[0].to_vec();
    for b in &bufs[1..] {
        reduce_bytes(dtype, op, &mut acc, b).unwrap();
    }
    if op == ReduceOp::Avg {
        finalize_avg_bytes(dtype, &mut acc, bufs.len() as u32).unwrap();
    }
    acc
}

/// The expected output of every rank (`None` where the output is unspecified).
pub fn expected(req: &ScheduleRequest, inputs: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let p = inputs.len();
    let e = req.dtype.size();
    let block = req.count as usize * e;
    let all: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    match req.collective {
        Collective::AllReduce { op } => vec![Some(reduce_all(req.dtype, op, &all)); p],
        Collective::Reduce { op, root } => {
            (0..p).map(|r| (r == root.index()).then(|| reduce_all(req.dtype, op, &all))).collect()
        }
        Collective::ReduceScatter { op } => {
            let full = reduce_all(req.dtype, op, &all);
            (0..p).map(|r| Some(full[r * block..(r + 1) * block].to_vec())).collect()
        }
        Collective::AllGather => vec![Some(inputs.concat()); p],
        Collective::Broadcast { root } => vec![Some(inputs[root.index()].clone()); p],
        Collective::AlltoAll => (0..p)
            .map(|r| Some((0..p).flat_map(|j| inputs[j][r * block..(r + 1) * block].to_vec()).collect()))
            .collect(),
        Collective::SendRecv { src, dst } => (0..p)
            .map(|r| if r == dst.index() { Some(inputs[src.index()].clone()) } else { Some(vec![0u8; block]) })
            .collect(),
    }
}

/// Build every schedule, run it in `order`, and compare with the reference.
pub fn run_and_check(fabric: &Fabric, req: &ScheduleRequest, seed: u64, order: ExecOrder) -> Vec<RankSchedule> {
    let p = fabric.layout().ranks();
    let scheds = r2ccl_algo::build_all(fabric, req).unwrap();
    let ins = inputs(req, p, seed);
    let outs = r2ccl_algo::execute(&scheds, &ins, order).unwrap();
    let want = expected(req, &ins);
    for (r, (got, want)) in outs.iter().zip(&want).enumerate() {
        if let Some(w) = want {
            assert_eq!(got, w, "rank {r} output differs for {req:?}");
        }
    }
    scheds
}
