//! The detector's bilateral failover protocol: sending (once, or reliably with retransmission),
//! starting a failover, and the REQ / ACK / HINT handlers that move a connection to a new path
//! with both ends agreeing on the epoch and boundary. Part of [`Detector`]; its state lives there.

#[allow(clippy::wildcard_imports, reason = "the detector split by concern: its types are the parent's")]
use super::*;

impl Detector {
    pub(super) fn send(&mut self, to: Rank, msg: OobMessage, ask: bool) {
        self.commands.push_back(if ask { Command::AskProbe { to, msg } } else { Command::SendOob { to, msg } });
    }

    pub(super) fn send_reliable(
        &mut self,
        now: Duration,
        key: RetxKey,
        to: Rank,
        msg: OobMessage,
        ask: bool,
        interval: Duration,
    ) {
        self.send(to, msg, ask);
        let left = self.cfg.oob_max_retries;
        self.retx.insert(key, Retx { to, msg, ask, next_at: now + interval, interval, left });
    }

    pub(super) fn start_failover(
        &mut self,
        now: Duration,
        conn: ConnId,
        reason: MigrationReason,
        target: Option<usize>,
    ) -> Result<(), DetectError> {
        let c = self.conns.get(&conn).ok_or(DetectError::UnknownConn(conn))?;
        let usable =
            |i: usize| c.path_id(conn, i).and_then(|p| self.paths.get(&p)).is_some_and(|p| p.state.is_usable());
        let index = match target {
            Some(i) => Some(i),
            None => (0..c.chain.len()).find(|&i| i != c.current && usable(i)),
        };
        let Some(index) = index else {
            let c = self.conns.get_mut(&conn).ok_or(DetectError::UnknownConn(conn))?;
            if !c.stuck {
                c.stuck = true;
                self.events.push_back(DetectEvent::NoBackup { at: now, conn });
                self.commands.push_back(Command::RequestReplan { reason: ReplanReason::NoBackup { conn } });
            }
            return Ok(());
        };
        let c = self.conns.get_mut(&conn).ok_or(DetectError::UnknownConn(conn))?;
        c.stuck = false;
        let epoch = c.epoch.next().max(c.hint_seen);
        c.epoch = epoch;
        let first = c.pending.is_none();
        let sender_done = c.pending.map_or(c.done, |p| p.sender_done.min(c.done));
        c.pending = Some(Pending { epoch, sender_done, index, reason });
        let (old, path) = (c.chain.get(c.current).copied(), c.chain.get(index).copied());
        let (Some(old), Some(path)) = (old, path) else { return Err(DetectError::UnknownConn(conn)) };
        if first {
            self.commands.push_back(Command::Quiesce { conn, path: old });
        }
        self.events.push_back(DetectEvent::FailoverStarted { at: now, conn, epoch, index, sender_done, reason });
        let msg = OobMessage::FailoverReq { conn, epoch, sender_done, reason, index: index as u16, path };
        self.send_reliable(now, RetxKey::Req(conn), conn.dst, msg, false, self.cfg.oob_retry);
        Ok(())
    }

    pub(super) fn start_hint(&mut self, now: Duration, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        if c.hint.is_some_and(|h| h > c.epoch) {
            return;
        }
        let epoch_hint = c.epoch.next();
        c.hint = Some(epoch_hint);
        let msg = OobMessage::FailoverHint { conn, epoch_hint, receiver_seen: c.done };
        self.events.push_back(DetectEvent::HintStarted { at: now, conn, epoch: epoch_hint });
        self.send_reliable(now, RetxKey::Hint(conn), conn.src, msg, false, self.cfg.hint_interval);
    }

    #[allow(clippy::too_many_arguments, reason = "the fields of one FAILOVER_REQ, destructured by the caller")]
    pub(super) fn on_req(
        &mut self,
        now: Duration,
        from: Rank,
        msg: OobMessage,
        conn: ConnId,
        epoch: FailoverEpoch,
        sender_done: u64,
        reason: MigrationReason,
        index: usize,
        path: PathPair,
    ) -> Result<(), DetectError> {
        let Some(c) = self.conns.get_mut(&conn) else {
            self.events.push_back(DetectEvent::Rejected { at: now, from, msg, why: "unknown connection" });
            return Ok(());
        };
        if c.role != Role::Receiver || from != conn.src || c.chain.get(index) != Some(&path) {
            self.events.push_back(DetectEvent::Rejected { at: now, from, msg, why: "not the receiver of this chain" });
            return Ok(());
        }
        if let Some((e, applied)) = c.applied.filter(|(e, _)| *e == epoch) {
            self.events.push_back(DetectEvent::DuplicateReq { at: now, conn, epoch });
            self.send(from, OobMessage::FailoverAck { conn, epoch: e, applied }, false);
            return Ok(());
        }
        if epoch <= c.epoch {
            self.events.push_back(DetectEvent::StaleIgnored { at: now, from, msg });
            return Ok(());
        }
        let applied = sender_done.min(c.done);
        let old_index = c.current;
        let old_pid = c.path_id(conn, old_index);
        let from_path = c.chain.get(old_index).copied().unwrap_or(path);
        c.epoch = epoch;
        c.applied = Some((epoch, applied));
        c.current = index;
        c.done = applied;
        if c.hint.is_some_and(|h| h <= epoch) {
            c.hint = None;
            self.retx.remove(&RetxKey::Hint(conn));
        }
        let cmd = match reason {
            MigrationReason::Failover => {
                Command::MigratePath { conn, epoch, from_path, to: path, index, boundary: applied }
            }
            MigrationReason::FailBack => {
                Command::FailBack { conn, epoch, from_path, to: path, index, boundary: applied }
            }
        };
        self.commands.push_back(Command::Quiesce { conn, path: from_path });
        self.commands.push_back(cmd);
        self.events.push_back(DetectEvent::FailoverAgreed {
            at: now,
            conn,
            epoch,
            boundary: applied,
            role: Role::Receiver,
        });
        self.send(from, OobMessage::FailoverAck { conn, epoch, applied }, false);
        self.fresh_path(now, conn, index);
        if reason == MigrationReason::Failover {
            if let Some(old) = old_pid {
                self.fail_hard(now, old, FailureCause::PeerNotice, None)?;
            }
        }
        Ok(())
    }

    pub(super) fn fresh_path(&mut self, now: Duration, conn: ConnId, index: usize) {
        let Some(pid) = self.conns.get(&conn).and_then(|c| c.path_id(conn, index)) else { return };
        if let Some(e) = self.paths.get_mut(&pid) {
            e.last_alive = e.last_alive.max(now);
        }
    }

    pub(super) fn on_ack(
        &mut self,
        now: Duration,
        from: Rank,
        msg: OobMessage,
        conn: ConnId,
        epoch: FailoverEpoch,
        applied: u64,
    ) -> Result<(), DetectError> {
        let Some(c) = self.conns.get_mut(&conn) else {
            self.events.push_back(DetectEvent::Rejected { at: now, from, msg, why: "unknown connection" });
            return Ok(());
        };
        let Some(p) = c.pending.filter(|p| p.epoch == epoch && c.role == Role::Sender && from == conn.dst) else {
            self.events.push_back(DetectEvent::StaleIgnored { at: now, from, msg });
            return Ok(());
        };
        let from_path = c.chain.get(c.current).copied();
        let to = c.chain.get(p.index).copied();
        let (Some(from_path), Some(to)) = (from_path, to) else { return Err(DetectError::UnknownConn(conn)) };
        c.pending = None;
        c.current = p.index;
        c.done = applied;
        self.retx.remove(&RetxKey::Req(conn));
        let (index, boundary) = (p.index, applied);
        self.commands.push_back(match p.reason {
            MigrationReason::Failover => Command::MigratePath { conn, epoch, from_path, to, index, boundary },
            MigrationReason::FailBack => Command::FailBack { conn, epoch, from_path, to, index, boundary },
        });
        self.events.push_back(DetectEvent::FailoverAgreed { at: now, conn, epoch, boundary, role: Role::Sender });
        self.commands.push_back(Command::RequestReplan { reason: ReplanReason::Migrated { conn } });
        self.fresh_path(now, conn, index);
        let id = self.new_id();
        let others: Vec<Rank> = self.members.iter().map(|m| m.rank).filter(|r| *r != self.me).collect();
        let notice = OobMessage::HotRepair { id, conn, epoch, failed: from_path, reason: p.reason };
        for rank in others {
            self.send_reliable(now, RetxKey::Repair(id, rank), rank, notice, false, self.cfg.oob_retry);
        }
        Ok(())
    }

    pub(super) fn on_hint(
        &mut self,
        now: Duration,
        from: Rank,
        msg: OobMessage,
        conn: ConnId,
        hint: FailoverEpoch,
    ) -> Result<(), DetectError> {
        let Some(c) = self.conns.get_mut(&conn) else {
            self.events.push_back(DetectEvent::Rejected { at: now, from, msg, why: "unknown connection" });
            return Ok(());
        };
        if c.role != Role::Sender || from != conn.dst {
            self.events.push_back(DetectEvent::Rejected {
                at: now,
                from,
                msg,
                why: "not the sender of this connection",
            });
            return Ok(());
        }
        if let Some(p) = c.pending {
            if hint <= p.epoch {
                // The receiver has not seen our REQ yet: resend it now.
                if let Some(r) = self.retx.get_mut(&RetxKey::Req(conn)) {
                    r.next_at = now + r.interval;
                    let (to, req) = (r.to, r.msg);
                    self.send(to, req, false);
                }
                return Ok(());
            }
        }
        if hint <= c.epoch {
            self.events.push_back(DetectEvent::StaleIgnored { at: now, from, msg });
            return Ok(());
        }
        c.hint_seen = c.hint_seen.max(hint);
        let pid = c.path_id(conn, c.current).ok_or(DetectError::UnknownConn(conn))?;
        self.fail_hard(now, pid, FailureCause::PeerNotice, None)?;
        let still_here = self.conns.get(&conn).is_some_and(|c| c.pending.is_none() && c.epoch < hint);
        if still_here {
            self.start_failover(now, conn, MigrationReason::Failover, None)?;
        }
        Ok(())
    }
}
