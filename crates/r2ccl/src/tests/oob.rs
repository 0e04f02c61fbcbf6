//! OOB mesh over loopback: all-to-all delivery, strangers dropped and counted, a dead
//! peer reported within a bounded time.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

use crate::bootstrap::{PeerInfo, Secret};
use crate::oob::{Channel, OobEvent, OobMesh};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

fn listeners(world: u32) -> (Vec<TcpListener>, Vec<PeerInfo>) {
    let ls: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let table = ls
        .iter()
        .enumerate()
        .map(|(r, l)| PeerInfo {
            rank: r as u32,
            node: "n".into(),
            oob_addr: l.local_addr().unwrap().to_string(),
            blob: vec![],
        })
        .collect();
    (ls, table)
}

fn build(world: u32, secret: &Secret, timeout: Duration) -> Vec<OobMesh> {
    let (ls, table) = listeners(world);
    let handles: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let (table, secret) = (table.clone(), secret.clone());
            thread::spawn(move || {
                OobMesh::establish(l, r as u32, &table, &secret, timeout, Instant::now() + Duration::from_secs(10))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

#[test]
fn all_to_all_messages_arrive_in_order() {
    let secret = Secret::generate().unwrap();
    let meshes = build(4, &secret, Duration::from_secs(5));
    for m in &meshes {
        for to in (0..4).filter(|&t| t != m.rank()) {
            for i in 0..3u8 {
                m.send(to, Channel::Control, &[m.rank() as u8, to as u8, i]).unwrap();
            }
        }
    }
    for m in &meshes {
        let mut got = Vec::new();
        while got.len() < 9 {
            match m.recv_deadline(Instant::now() + Duration::from_secs(5)).expect("message by deadline") {
                OobEvent::Message { from, channel: Channel::Control, payload } => got.push((from, payload)),
                other => panic!("unexpected {other:?}"),
            }
        }
        for from in (0..4).filter(|&f| f != m.rank()) {
            let seq: Vec<u8> = got.iter().filter(|(f, _)| *f == from).map(|(_, p)| p[2]).collect();
            assert_eq!(seq, vec![0, 1, 2], "in order from {from}");
            assert!(got.iter().filter(|(f, _)| *f == from).all(|(_, p)| p[..2] == [from as u8, m.rank() as u8]));
        }
        assert_eq!(m.rejected(), 0);
    }
}

#[test]
fn a_batch_arrives_as_its_messages_in_order() {
    let secret = Secret::generate().unwrap();
    let meshes = build(2, &secret, Duration::from_secs(5));
    // Empty, small and large payloads in one write, then a single message after them.
    let batch: Vec<Vec<u8>> = vec![Vec::new(), vec![1], (0..70_000u32).map(|i| i as u8).collect(), vec![2, 3]];
    meshes[0].send_many(1, Channel::Detect, &batch).unwrap();
    meshes[0].send(1, Channel::Detect, &[9]).unwrap();
    let mut got = Vec::new();
    while got.len() < batch.len() + 1 {
        match meshes[1].recv_deadline(Instant::now() + Duration::from_secs(5)).expect("message by deadline") {
            OobEvent::Message { from: 0, channel: Channel::Detect, payload } => got.push(payload),
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut want = batch.clone();
    want.push(vec![9]);
    assert_eq!(got, want);
    assert_eq!(meshes[1].rejected(), 0);
}

#[test]
fn strangers_are_rejected_and_counted() {
    let secret = Secret::generate().unwrap();
    let (ls, table) = listeners(2);
    let addr1 = table[1].oob_addr.clone();
    let mut it = ls.into_iter();
    let (l0, l1) = (it.next().unwrap(), it.next().unwrap());
    let (t0, s0) = (table.clone(), secret.clone());
    let h0 = thread::spawn(move || {
        OobMesh::establish(l0, 0, &t0, &s0, Duration::from_secs(5), Instant::now() + Duration::from_secs(10))
    });
    let (t1, s1) = (table.clone(), secret.clone());
    let h1 = thread::spawn(move || {
        OobMesh::establish(l1, 1, &t1, &s1, Duration::from_secs(5), Instant::now() + Duration::from_secs(10))
    });
    let m0 = h0.join().unwrap().unwrap();
    let _m1 = h1.join().unwrap().unwrap();
    // A stranger knocks on rank 0's listener with a made-up proof.
    let mut s = TcpStream::connect(&table[0].oob_addr).unwrap();
    let mut nonce = [0u8; 16];
    s.read_exact(&mut nonce).unwrap();
    s.write_all(&[1, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]).unwrap();
    let mut buf = [0u8; 1];
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "stranger's connection is closed");
    let deadline = Instant::now() + Duration::from_secs(3);
    while m0.rejected() == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(m0.rejected(), 1);
    let _ = addr1;
}

#[test]
fn a_dead_peer_is_reported_promptly() {
    let secret = Secret::generate().unwrap();
    let mut meshes = build(3, &secret, Duration::from_secs(2));
    let dead = meshes.remove(2);
    let start = Instant::now();
    drop(dead);
    for m in &meshes {
        match m.recv_deadline(Instant::now() + Duration::from_secs(5)) {
            Some(OobEvent::PeerLost { rank: 2, why }) => assert!(why.contains("closed"), "{why}"),
            other => panic!("rank {}: expected PeerLost for rank 2, got {other:?}", m.rank()),
        }
    }
    assert!(start.elapsed() < Duration::from_secs(1), "EOF is noticed at once: {:?}", start.elapsed());
}
