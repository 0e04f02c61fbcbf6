//! Four ranks as threads of one process, each a node of its own with two NICs on loopback:
//! typed collectives (AllReduce out of place and in place, AllGather, ReduceScatter,
//! Broadcast), two calls overlapped in a scope, a ring of sends and receives in one group, and
//! a registered buffer; every result is checked. Run: `cargo run -p r2ccl --example allreduce_threads`.
#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use r2ccl::{bf16, CommError, Communicator, Rank, ReduceOp, Root, UniqueId};

const WORLD: u32 = 4;
const N: usize = 1 << 18;

fn rank_main(r: u32, id: UniqueId, root: Option<Root>) -> Result<(), CommError> {
    let comm =
        Communicator::builder(Rank(r), WORLD, id).node(format!("node{r}")).nics(["lo", "lo"]).root(root).init()?;
    let w = WORLD as usize;
    let check = |what: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(CommError::Invalid(format!("rank {r}: {what} gave a wrong result")))
        }
    };

    // AllReduce of f32: 1 + 2 + 3 + 4.
    let send = vec![r as f32 + 1.0; N];
    let mut sum = vec![0.0f32; N];
    let report = comm.all_reduce(&send, &mut sum, ReduceOp::Sum)?;
    check("all_reduce", sum.iter().all(|&x| x == 10.0))?;
    if r == 0 {
        println!("all_reduce of {N} f32: #{} strategy {}, {:.1} ms", report.seq, report.strategy, report.seconds * 1e3);
    }

    // In place, on bf16: the maximum over the ranks.
    let mut m = vec![bf16::from_f32(r as f32); N];
    comm.all_reduce_in_place(&mut m, ReduceOp::Max)?;
    check("all_reduce_in_place", m.iter().all(|&x| x == bf16::from_f32(3.0)))?;

    // AllGather of each rank's id, ReduceScatter back to one block each.
    let mine = [u64::from(r); 3];
    let mut all = vec![0u64; 3 * w];
    comm.all_gather(&mine, &mut all)?;
    check("all_gather", all.chunks(3).enumerate().all(|(j, b)| b.iter().all(|&x| x == j as u64)))?;
    let mut block = [0u64; 3];
    comm.reduce_scatter(&all, &mut block, ReduceOp::Sum)?;
    check("reduce_scatter", block == [u64::from(r) * u64::from(WORLD); 3])?;

    // Broadcast from rank 2, in place.
    let mut b = vec![if r == 2 { 42i32 } else { -1 }; 1000];
    comm.broadcast_in_place(&mut b, Rank(2))?;
    check("broadcast_in_place", b.iter().all(|&x| x == 42))?;

    // Two calls in flight while this thread goes on; both waited for by the scope's end.
    let (mut big, mut flag) = (vec![1.0f64; N], [u32::from(r == 1)]);
    comm.scope(|s| -> Result<(), CommError> {
        let a = s.all_reduce_in_place(&mut big, ReduceOp::Sum)?;
        let f = s.all_reduce_in_place(&mut flag, ReduceOp::Max)?;
        a.wait()?;
        f.wait()?;
        Ok(())
    })?;
    check("scope", big.iter().all(|&x| x == f64::from(WORLD)) && flag == [1])?;

    // A ring: send to the next rank, receive from the previous, in one group.
    let next = Rank((r + 1) % WORLD);
    let prev = Rank((r + WORLD - 1) % WORLD);
    let out = vec![r as u8; 4096];
    let mut got = vec![0u8; 4096];
    comm.group(|g| {
        g.send(&out, next).recv(&mut got, prev);
    })?;
    check("group", got.iter().all(|&x| u32::from(x) == prev.0))?;

    // Registered memory: read and written where it is.
    let mut reg = comm.alloc::<i64>(N)?;
    reg.fill(i64::from(r));
    comm.all_reduce_in_place(&mut reg, ReduceOp::Sum)?;
    check("registered", reg.iter().all(|&x| x == 6))?;
    drop(reg);

    comm.finalize()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Rank 0 creates the id and keeps the listener; the others get the id (here by a spawn).
    let root = Root::create([127, 0, 0, 1].into())?;
    let id = root.unique_id()?;
    println!("rendezvous at {}", id.root);
    let mut root = Some(root);
    let threads: Vec<_> = (0..WORLD)
        .map(|r| {
            let (id, root) = (id.clone(), if r == 0 { root.take() } else { None });
            std::thread::spawn(move || rank_main(r, id, root))
        })
        .collect();
    for (r, t) in threads.into_iter().enumerate() {
        t.join().map_err(|_| format!("rank {r} panicked"))??;
    }
    println!("every rank's results are exact");
    Ok(())
}
