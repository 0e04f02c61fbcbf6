//! Receipts off a small collective's critical path: small sends linger past their collective in
//! a private pool until confirmed, a peer's later chunks imply receipts, and receivers hold the
//! receipts of small transfers back until a chunk of their own implies them or a short delay
//! passes.
//!
//! The rules, and why no byte can be lost:
//! - A send of at most [`LINGER_MAX_BYTES`] whose chunks have all left (the backend reads its
//!   source no more) may end its collective unconfirmed: its bytes are first copied into the
//!   linger pool and the session replays from there ([`Session::rebase_send`]), so the next
//!   collective may overwrite its old source. It stays in the session, with its lanes and
//!   their migration, until a receipt comes, explicit or implied.
//! - Implied receipt: a peer sends its chunks of collective `s` only once it has finished every
//!   collective before `s` (one at a time, each ending when every receive is whole). So an
//!   authentic chunk of `s` from a peer ([`Session::peer_seq`]) confirms every transfer of an
//!   earlier collective from this rank to it.
//! - A receiver holds the receipt of a small, non-empty transfer back for [`RECEIPT_DELAY`] when
//!   it also sends to that peer in the same collective, to at most 16 peers in all (an exchange,
//!   as in recursive doubling; a ring's receipts, and an AlltoAll's among many ranks, go at
//!   once): a non-empty send of a later collective to the same peer implies it (that chunk
//!   reaches the peer, or is replayed until it does), and the explicit receipt is then not sent
//!   at all. Back-to-back small collectives between the same peers send none.
//! - Small sends that a later step overwrites go out of their private copy from the start
//!   (`sends_copied_at_once`), so no write inside a collective waits for a held-back receipt.
//! - A rank whose call was refused before it started (invalid arguments: every rank refuses the
//!   same call, and the communicator goes on) uses its sequence number up without receiving
//!   anything; its later chunks then confirm sends to it of that collective. Only a peer that
//!   called it differently sends any, and that peer's call completes while this rank's caller
//!   has the error, as an `ncclSend` completes once its buffer may be reused.

use super::*;

/// The largest transfer whose receipt may come after its collective (and whose receiver holds
/// the receipt back): both ends apply the same bound to the same schedule length.
pub const LINGER_MAX_BYTES: u64 = 16 * 1024;
/// How long a receiver holds the receipt of a small transfer back, waiting for a chunk of its
/// own to the sender that implies it.
pub const RECEIPT_DELAY: Duration = Duration::from_millis(10);
/// The linger pool's size (registered on first use; a send that finds no room waits for its
/// receipt, as a large one does).
const POOL_BYTES: u64 = 1 << 20;
/// A receiver holds receipts back only in collectives where it sends to at most this many peers
/// (their small sends fit the sender's pool several collectives over).
const HOLD_BACK_MAX_PEERS: usize = 16;
/// Alignment of the pool's slots.
const SLOT_ALIGN: u64 = 64;

/// Sends lingering past their collective, and receipts held back.
#[derive(Debug, Default)]
pub(super) struct Linger {
    /// The pool lingering sends replay from, once registered.
    pool: Option<MemHandle>,
    /// The backend refused the pool: nothing lingers.
    no_pool: bool,
    /// Lingering sends: their slot in the pool (offset, length).
    sends: BTreeMap<TransferKey, (u64, u64)>,
    /// Receipts held back, with the time each is sent by.
    owed: BTreeMap<TransferKey, Duration>,
    /// Receipts the running collective's sends implied (not sent): sent after all if it is
    /// abandoned, since its chunks may never have left.
    implied_now: Vec<TransferKey>,
    /// Sends that ended their collective unconfirmed (since start).
    lingered: u64,
    /// Receipts never sent because a later chunk implied them (since start).
    implied: u64,
    /// Lanes of lingering sends that had to migrate (since start).
    pub(super) migrated: u64,
}

impl Linger {
    /// This rank starts a non-empty send of `key`: the peer learns from its chunks that every
    /// transfer from it of an earlier collective arrived here, so those receipts are not sent.
    pub(super) fn imply(&mut self, key: TransferKey) {
        let implied_now = &mut self.implied_now;
        self.owed.retain(|k, _| {
            let implied = k.src == key.dst && k.seq < key.seq;
            if implied {
                implied_now.push(*k);
            }
            !implied
        });
    }

    /// A collective begins: the one before finished, every chunk of it posted, so the receipts
    /// its sends implied stand.
    pub(super) fn begin(&mut self) {
        self.implied += self.implied_now.len() as u64;
        self.implied_now.clear();
    }

    /// A free slot of `len` bytes (first fit), or `None` when the pool is full.
    fn alloc(&self, len: u64) -> Option<u64> {
        let mut at = 0u64;
        let mut used: Vec<(u64, u64)> = self.sends.values().copied().collect();
        used.sort_unstable();
        for (off, l) in used {
            if off >= at + len {
                break;
            }
            at = at.max((off + l).next_multiple_of(SLOT_ALIGN));
        }
        (at + len <= POOL_BYTES).then_some(at)
    }
}

impl Engine {
    /// Whether a transfer of `len` bytes may linger (and has its receipt held back).
    pub(super) const fn small(len: u64) -> bool {
        len <= LINGER_MAX_BYTES
    }

    /// A receipt for `key` (explicit, or implied by a later chunk): the send is released. Whether
    /// it was a send this rank still waited for.
    pub(super) fn on_receipt(&mut self, now: Duration, key: TransferKey) -> Result<bool, EngineError> {
        self.session.release_send(key);
        // Its lanes need no path any more: a stale no-path entry would fail a later
        // collective when its timeout ran out (choose_path finds nothing for a released send).
        self.migrations.handle_released(now, key)?;
        let current = self.exec.as_mut().is_some_and(|x| x.unacked.remove(&key));
        Ok(current || self.linger.sends.remove(&key).is_some())
    }

    /// Releases every unconfirmed send whose receiver has since sent a chunk of a later
    /// collective (an implied receipt).
    pub(super) fn release_implied(&mut self, now: Duration) -> Result<(), EngineError> {
        let comm = CommId(self.cfg.comm);
        let session = &self.session;
        let implied = |k: &TransferKey| session.peer_seq(comm, k.dst).is_some_and(|s| s > k.seq);
        let mut done: Vec<TransferKey> = self.linger.sends.keys().copied().filter(implied).collect();
        if let Some(x) = &self.exec {
            done.extend(x.unacked.iter().copied().filter(implied));
        }
        for key in done {
            self.on_receipt(now, key)?;
        }
        Ok(())
    }

    /// Moves every small, drained, unconfirmed send of the running collective (whose steps are
    /// all done) into the linger pool, so the collective can finish without its receipt.
    pub(super) fn linger_sends<T: Transport + ?Sized>(&mut self, t: &mut T) -> Result<(), EngineError> {
        let Some((work, _)) = self.work else { return Ok(()) };
        let Some(x) = &self.exec else { return Ok(()) };
        if x.done != x.state.len() || x.unacked.is_empty() {
            return Ok(());
        }
        let mut moves = Vec::new();
        for &key in &x.unacked {
            let Some(&j) = x.by_send.get(&key) else { continue };
            let StepKind::Send { src, .. } = x.sched.steps()[j].kind else { continue };
            if !Self::small(src.len) || src.len == 0 {
                continue;
            }
            let (region, at) = match (x.rebased[j], x.staging[j]) {
                (true, Some(stage)) => (work, stage as usize),
                _ => place(&x.base, &src),
            };
            if self.session.is_send_drained(key) && !t.reads_region(region, at, src.len as usize) {
                moves.push((key, region, at, src));
            }
        }
        if moves.is_empty() {
            return Ok(());
        }
        let pool = match self.linger.pool {
            Some(h) => h,
            None if self.linger.no_pool => return Ok(()),
            None => match t.register(POOL_BYTES as usize) {
                Ok(h) => {
                    self.linger.pool = Some(h);
                    h
                }
                Err(e) => {
                    // Not fatal: collectives wait for their receipts, as large ones do.
                    tracing::warn!(target: subsys::COLL, rank = %self.rank, error = %e, "no linger pool: small collectives wait for their receipts");
                    self.linger.no_pool = true;
                    return Ok(());
                }
            },
        };
        for (key, region, at, src) in moves {
            let Some(off) = self.linger.alloc(src.len) else { break };
            move_bytes(t, (region, at), (pool, off as usize), src.len as usize, None, src)?;
            self.session.rebase_send(t, key, Buffer { region: pool, offset: off as usize, len: src.len })?;
            self.linger.sends.insert(key, (off, src.len));
            self.linger.lingered += 1;
            if let Some(x) = &mut self.exec {
                x.unacked.remove(&key);
            }
        }
        Ok(())
    }

    /// Every receive of `key` landed: confirm it to the sender now, or (a small transfer from a
    /// peer this rank also sends to in this collective, as in recursive doubling, so likely in
    /// the next one too) by [`RECEIPT_DELAY`] unless a send of this rank's implies it first.
    pub(super) fn owe_receipt(&mut self, now: Duration, key: TransferKey, len: u64) {
        // Few peers (recursive doubling has log2 W): a sender with many small sends (an AlltoAll)
        // may not fit them all in its pool, and would wait for what is held back.
        let exchange = |x: &Exec| x.send_peers.len() <= HOLD_BACK_MAX_PEERS && x.send_peers.contains(&key.src);
        if Self::small(len) && len > 0 && self.exec.as_ref().is_some_and(exchange) {
            self.linger.owed.insert(key, now + RECEIPT_DELAY);
        } else {
            self.send_ctrl(key.src, Ctrl::RecvDone { key });
        }
    }

    /// Sends the receipts held back whose time has come (all of them with `all`: this rank is
    /// leaving, or its collective was abandoned).
    pub(super) fn send_owed_receipts(&mut self, now: Duration, all: bool) {
        if self.linger.owed.is_empty() {
            return;
        }
        let due: Vec<TransferKey> =
            self.linger.owed.iter().filter(|(_, &at)| all || now >= at).map(|(&k, _)| k).collect();
        for key in due {
            self.linger.owed.remove(&key);
            self.send_ctrl(key.src, Ctrl::RecvDone { key });
        }
    }

    /// Sends every receipt held back now (before this rank leaves the communicator, so that no
    /// peer waits for one).
    pub fn flush_receipts(&mut self, now: Duration) {
        self.send_owed_receipts(now, true);
    }

    /// `peer` left the communicator after finishing collective `last_done`: it receives nothing
    /// more, so the sends lingering for its receipt are released (and the running collective's
    /// sends to it up to `last_done`, which it received), and the receipts held back for it are
    /// dropped.
    pub fn peer_left(&mut self, now: Duration, peer: Rank, last_done: u64) -> Result<(), EngineError> {
        let mut gone: Vec<TransferKey> = self.linger.sends.keys().copied().filter(|k| k.dst == peer).collect();
        if let Some(x) = &self.exec {
            gone.extend(x.unacked.iter().copied().filter(|k| k.dst == peer && k.seq <= last_done));
        }
        for key in gone {
            self.on_receipt(now, key)?;
        }
        self.linger.owed.retain(|k, _| k.src != peer);
        Ok(())
    }

    /// When the next held-back receipt is due.
    pub(super) fn receipt_deadline(&self) -> Option<Duration> {
        self.linger.owed.values().copied().min()
    }

    /// Whether `key` is a send that lingers past its collective.
    pub(super) fn is_lingering(&self, key: &TransferKey) -> bool {
        self.linger.sends.contains_key(key)
    }

    /// A collective was abandoned (the communicator is broken, and the lanes' migrations are
    /// cleared with it): every lingering send is given up, and the receipts its sends were to
    /// imply are sent after all (its chunks may never have left).
    pub(super) fn drop_lingering(&mut self) {
        for key in std::mem::take(&mut self.linger.sends).into_keys() {
            self.session.release_send(key);
        }
        for key in std::mem::take(&mut self.linger.implied_now) {
            self.send_ctrl(key.src, Ctrl::RecvDone { key });
        }
    }

    /// (sends that ended their collective unconfirmed, receipts a later chunk implied, lanes of
    /// lingering sends that migrated), since start.
    #[cfg(test)]
    pub fn linger_counts(&self) -> (u64, u64, u64) {
        (self.linger.lingered, self.linger.implied + self.linger.implied_now.len() as u64, self.linger.migrated)
    }

    /// Sends lingering past their collective, unconfirmed.
    pub fn lingering(&self) -> usize {
        self.linger.sends.len()
    }
}
