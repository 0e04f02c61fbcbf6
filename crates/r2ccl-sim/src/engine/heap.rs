//! The engine's pending flow completions: an indexed binary min-heap on (time, sequence number).

/// Pending flow completions, at most one per flow: a binary min-heap on (time, sequence number) that knows each
/// flow's position, so a flow whose rate changes moves its entry instead of leaving a stale one behind. Keys are
/// unique (sequence numbers are), so the order of pops does not depend on the heap's shape.
#[derive(Debug, Default)]
pub(super) struct Completions {
    /// (time as [`time_key`], sequence number, flow).
    pub(super) heap: Vec<(u64, u64, u32)>,
    /// Per flow: its index in `heap`, or `ABSENT`.
    pub(super) pos: Vec<u32>,
}

/// A flow with no pending completion.
pub(super) const ABSENT: u32 = u32::MAX;

/// Children per node of the completion heap.
pub(super) const ARITY: usize = 2;

/// An integer with the order of [`f64::total_cmp`].
pub(super) fn time_key(t: f64) -> u64 {
    let b = t.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

/// The time of a [`time_key`].
pub(super) fn key_time(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

impl Completions {
    pub(super) fn is_before(a: &(u64, u64, u32), b: &(u64, u64, u32)) -> bool {
        (a.0, a.1) < (b.0, b.1)
    }

    /// Make flow `s`'s completion due at `t`, with sequence number `seq`.
    pub(super) fn set(&mut self, s: u32, t: f64, seq: u64) {
        let si = s as usize;
        if si >= self.pos.len() {
            self.pos.resize(si + 1, ABSENT);
        }
        let item = (time_key(t), seq, s);
        match self.pos[si] {
            ABSENT => {
                self.heap.push(item);
                self.sift_up(self.heap.len() - 1, item);
            }
            p => {
                let i = p as usize;
                if Self::is_before(&item, &self.heap[i]) {
                    self.sift_up(i, item);
                } else {
                    self.sift_down(i, item);
                }
            }
        }
    }

    /// Drop flow `s`'s pending completion, if any.
    pub(super) fn remove(&mut self, s: u32) {
        let Some(&p) = self.pos.get(s as usize) else { return };
        if p == ABSENT {
            return;
        }
        self.pos[s as usize] = ABSENT;
        let i = p as usize;
        let Some(last) = self.heap.pop() else { return };
        if i < self.heap.len() {
            // Move the hole at `i` down to a leaf along the earliest children, then put the last entry there and
            // let it rise: it usually belongs near the bottom, so this compares less than sifting it down.
            let mut h = i;
            while let Some(m) = self.earliest_child(h) {
                let child = self.heap[m];
                self.heap[h] = child;
                self.pos[child.2 as usize] = h as u32;
                h = m;
            }
            self.sift_up(h, last);
        }
    }

    /// The earliest of the children of heap slot `h`, if it has any.
    pub(super) fn earliest_child(&self, h: usize) -> Option<usize> {
        let n = self.heap.len();
        let first = ARITY * h + 1;
        if first >= n {
            return None;
        }
        let mut m = first;
        for c in first + 1..(first + ARITY).min(n) {
            if Self::is_before(&self.heap[c], &self.heap[m]) {
                m = c;
            }
        }
        Some(m)
    }

    /// The earliest pending completion.
    pub(super) fn first(&self) -> Option<(f64, u64, u32)> {
        self.heap.first().map(|&(k, seq, s)| (key_time(k), seq, s))
    }

    /// Put `item` at the hole `i` or above it, moving the later parents down.
    pub(super) fn sift_up(&mut self, mut i: usize, item: (u64, u64, u32)) {
        while i > 0 {
            let p = (i - 1) / ARITY;
            let parent = self.heap[p];
            if !Self::is_before(&item, &parent) {
                break;
            }
            self.heap[i] = parent;
            self.pos[parent.2 as usize] = i as u32;
            i = p;
        }
        self.heap[i] = item;
        self.pos[item.2 as usize] = i as u32;
    }

    /// Put `item` at the hole `i` or below it, moving the earliest children up.
    pub(super) fn sift_down(&mut self, mut i: usize, item: (u64, u64, u32)) {
        while let Some(m) = self.earliest_child(i) {
            let child = self.heap[m];
            if !Self::is_before(&child, &item) {
                break;
            }
            self.heap[i] = child;
            self.pos[child.2 as usize] = i as u32;
            i = m;
        }
        self.heap[i] = item;
        self.pos[item.2 as usize] = i as u32;
    }
}
