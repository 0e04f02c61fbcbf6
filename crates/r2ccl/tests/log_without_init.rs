//! `R2CCL_DEBUG` in an application that never installs a log subscriber (this test binary):
//! the communicator installs one, and the file it writes holds the version banner and the
//! NIC failure's lines, each with NCCL's `host:pid:tid` prefix.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

mod common;

use r2ccl::{ReduceOp, Root};

#[test]
fn r2ccl_debug_logs_with_the_prefix_in_an_application_that_never_called_init() {
    let dir = std::env::temp_dir().join(format!("r2ccl-log-without-init-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Set before any thread starts.
    std::env::set_var("R2CCL_DEBUG", "INFO");
    std::env::set_var("R2CCL_DEBUG_FILE", dir.join("r2ccl.%p.log"));
    std::env::set_var("R2CCL_FAULT", "rank=1,nic=0,after_bytes=6M,kind=down");
    let root = Root::create([127, 0, 0, 1].into()).unwrap();
    let id = root.unique_id().unwrap();
    let mut root = Some(root);
    let threads: Vec<_> = (0..2u32)
        .map(|me| {
            let (id, root) = (id.clone(), if me == 0 { root.take() } else { None });
            std::thread::spawn(move || {
                let comm = common::builder(me, 2, &id, common::config(5_000))
                    .root(root)
                    .fault_injection_from_env(true)
                    .init()
                    .unwrap();
                for _ in 0..4 {
                    let mut v = vec![1.0f32; 1 << 20];
                    comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert!(v.iter().all(|&x| x == 2.0));
                }
                comm.finalize().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let path = dir.join(format!("r2ccl.{}.log", std::process::id()));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_owned();
    let prefix = format!(" {host}:{}:", std::process::id());
    let banner: Vec<&str> = text.lines().filter(|l| l.contains(" (UCX ") && l.contains("rank 0 of 2")).collect();
    assert!(!banner.is_empty() && banner.iter().all(|l| l.contains(&prefix)), "no banner with {prefix:?}:\n{text}");
    let failure: Vec<&str> = text.lines().filter(|l| l.contains("r2ccl::net") && l.contains("down")).collect();
    assert!(!failure.is_empty(), "no NIC failure lines:\n{text}");
    assert!(failure.iter().all(|l| l.contains(&prefix)), "a line without {prefix:?}: {failure:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
