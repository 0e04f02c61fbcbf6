//! Two-process UCX tests over TCP on loopback: the test binary re-executes itself as the peer (role in
//! an environment variable), and the two exchange worker addresses as hex lines over the child's
//! stdin/stdout. Covers a 64 MiB round trip, bit-exact, and a peer that dies mid-session.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "a harness-less test reports on the terminal")]

use r2ccl_ucx::{wait_all, Context, ContextConfig, Pending, Worker, WorkerAddress};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE_VAR: &str = "R2CCL_UCX_TEST_ROLE";
const BIG: usize = 64 << 20;
const DEADLINE: Duration = Duration::from_secs(30);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(131).wrapping_add(seed) ^ ((i >> 12) as u8)).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn worker_on_lo() -> Worker {
    Worker::new(Context::new(ContextConfig::tcp("lo")).unwrap()).unwrap()
}

/// Read lines until one starts with `prefix`; return the rest.
fn read_tagged(r: &mut impl BufRead, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "peer closed its output before sending {prefix}");
        if let Some(rest) = line.trim_end().strip_prefix(prefix) {
            return rest.trim().to_owned();
        }
    }
}

// ---- child side ----

fn child(role: &str) {
    let w = worker_on_lo();
    let mut out = std::io::stdout();
    writeln!(out, "ADDR {}", hex(w.address().unwrap().as_bytes())).unwrap();
    out.flush().unwrap();
    let mut stdin = BufReader::new(std::io::stdin());
    let parent = WorkerAddress::from_bytes(unhex(&read_tagged(&mut stdin, "ADDR")));
    let ep = w.connect(&parent, "child->parent").unwrap();
    match role {
        "echo" => {
            let mut recv = w.tag_recv(1, u64::MAX, vec![0u8; BIG]).unwrap();
            assert_eq!(recv.wait(DEADLINE).unwrap(), BIG);
            let data = recv.take_buffer().unwrap();
            let mut send = ep.tag_send(2, data).unwrap();
            assert_eq!(send.wait(DEADLINE).unwrap(), BIG);
            ep.flush(DEADLINE).unwrap();
            writeln!(out, "DONE").unwrap();
            out.flush().unwrap();
            // Stay up until the parent has everything.
            read_tagged(&mut stdin, "BYE");
            ep.close(Duration::from_secs(2)).ok();
        }
        "die" => {
            let mut recv = w.tag_recv(3, u64::MAX, vec![0u8; 16]).unwrap();
            assert_eq!(recv.wait(DEADLINE).unwrap(), 16);
            let mut ack = ep.tag_send(4, vec![9u8; 16]).unwrap();
            ack.wait(DEADLINE).unwrap();
            ep.flush(DEADLINE).unwrap();
            writeln!(out, "DYING").unwrap();
            out.flush().unwrap();
            // Die without closing anything: the kernel closes the sockets, UCX never says goodbye.
            std::process::exit(0);
        }
        other => panic!("unknown role {other}"),
    }
}

// ---- parent side ----

/// Like `read_tagged`, but keeps progressing `w` while waiting: the child's flush and close
/// need this side's worker to answer.
fn read_tagged_progressing(w: &Worker, r: &mut BufReader<ChildStdout>, prefix: &'static str) -> String {
    std::thread::scope(|s| {
        let reader = s.spawn(move || read_tagged(r, prefix));
        while !reader.is_finished() {
            w.progress();
            std::thread::yield_now();
        }
        reader.join().unwrap()
    })
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

fn spawn(role: &str, w: &Worker) -> (Peer, WorkerAddress) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(ROLE_VAR, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let addr = WorkerAddress::from_bytes(unhex(&read_tagged(&mut stdout, "ADDR")));
    writeln!(stdin, "ADDR {}", hex(w.address().unwrap().as_bytes())).unwrap();
    stdin.flush().unwrap();
    (Peer { child, stdin, stdout }, addr)
}

fn sixty_four_mib_round_trip_between_two_processes_is_bit_exact() {
    let w = worker_on_lo();
    let (mut peer, addr) = spawn("echo", &w);
    let ep = w.connect(&addr, "parent->child").unwrap();
    let data = pattern(BIG, 7);
    let start = Instant::now();
    let mut recv = w.tag_recv(2, u64::MAX, vec![0u8; BIG]).unwrap();
    let mut send = ep.tag_send(1, data.clone()).unwrap();
    wait_all(&[&w], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(send.poll().unwrap().unwrap(), BIG);
    assert_eq!(recv.poll().unwrap().unwrap(), BIG);
    assert!(recv.take_buffer().unwrap() == data, "64 MiB came back different");
    read_tagged_progressing(&w, &mut peer.stdout, "DONE");
    writeln!(peer.stdin, "BYE").unwrap();
    peer.stdin.flush().unwrap();
    // Keep progressing while the child closes its endpoint gracefully.
    let until = Instant::now() + Duration::from_secs(5);
    while peer.child.try_wait().unwrap().is_none() && Instant::now() < until {
        w.progress();
    }
    let status = peer.child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    eprintln!(
        "  64 MiB there and back in {elapsed:?} ({:.2} GB/s each way, debug build)",
        (2 * BIG) as f64 / elapsed.as_secs_f64() / 1e9
    );
}

fn an_endpoint_to_a_peer_that_dies_reports_an_error_without_hanging() {
    let w = worker_on_lo();
    let (mut peer, addr) = spawn("die", &w);
    let ep = w.connect(&addr, "parent->child").unwrap();
    let mut recv = w.tag_recv(4, u64::MAX, vec![0u8; 16]).unwrap();
    let mut send = ep.tag_send(3, vec![1u8; 16]).unwrap();
    wait_all(&[&w], &mut [&mut send as &mut dyn Pending, &mut recv], DEADLINE).unwrap();
    read_tagged_progressing(&w, &mut peer.stdout, "DYING");
    let died = Instant::now();
    peer.child.wait().unwrap();

    // Idle endpoint: the peer's sockets were closed by its kernel; UCX should notice on progress.
    let watch = Duration::from_secs(5);
    while ep.failure().is_none() && died.elapsed() < watch {
        w.progress();
    }
    let idle_detect = ep.failure().map(|s| (died.elapsed(), s));

    // A send to the dead peer must end (error or deadline), never hang.
    let posted = Instant::now();
    let outcome = match ep.tag_send(5, vec![2u8; 4 << 20]) {
        Ok(mut req) => req.wait(Duration::from_secs(5)),
        Err(e) => Err(e),
    };
    let send_end = posted.elapsed();
    let err = outcome.expect_err("a send to a dead peer cannot succeed");
    assert!(send_end < Duration::from_secs(6), "send to a dead peer took {send_end:?}");
    match idle_detect {
        Some((t, s)) => {
            eprintln!("  dead peer: endpoint error after {t:?} ({s}); then send failed in {send_end:?}: {err}")
        }
        None => eprintln!("  dead peer: no endpoint error within {watch:?}; send ended in {send_end:?}: {err}"),
    }
    drop(ep);
    assert_eq!(w.orphan_count(), 0, "failed requests are released");
}

fn main() {
    if let Ok(role) = std::env::var(ROLE_VAR) {
        child(&role);
        return;
    }
    let tests: [(&str, fn()); 2] = [
        (
            "sixty_four_mib_round_trip_between_two_processes_is_bit_exact",
            sixty_four_mib_round_trip_between_two_processes_is_bit_exact,
        ),
        (
            "an_endpoint_to_a_peer_that_dies_reports_an_error_without_hanging",
            an_endpoint_to_a_peer_that_dies_reports_an_error_without_hanging,
        ),
    ];
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut ran = 0;
    for (name, f) in tests {
        if filter.iter().all(|p| name.contains(p.as_str())) {
            let start = Instant::now();
            f();
            eprintln!("test {name} ... ok ({:?})", start.elapsed());
            ran += 1;
        }
    }
    eprintln!("test result: ok. {ran} passed; 0 failed (two_process)");
}
