//! Rates: after every change the engine recomputes each live flow's rate, by ports (one flow at
//! a time per port), max-min fair sharing of links, or each flow alone on its links. Part of the
//! simulator's `Sim`; its state lives there.

#[allow(clippy::wildcard_imports, reason = "the engine split by concern: its types are the parent's")]
use super::*;

impl Sim<'_> {
    /// Recompute max-min fair rates in the components touched by dirty links.
    pub(super) fn recompute(&mut self) {
        self.gen = self.gen.wrapping_add(1);
        if self.gen == 0 {
            self.link_mark.iter_mut().for_each(|m| *m = 0);
            self.sub_mark.iter_mut().for_each(|m| *m = 0);
            self.frozen.iter_mut().for_each(|m| *m = 0);
            self.gen = 1;
        }
        let gen = self.gen;
        self.comp_links.clear();
        self.comp_subs.clear();
        let mut dirty = std::mem::take(&mut self.dirty);
        for &l in &dirty {
            if self.link_mark[l as usize] == gen {
                continue;
            }
            if self.live[l as usize] > 0 {
                self.link_mark[l as usize] = gen;
                self.stack.push(l);
            } else {
                // A gated link that just stopped taking part: its flows' components change, but it is no
                // constraint of them (and stays unmarked).
                for i in 0..self.link_subs[l as usize].len() {
                    let s = self.link_subs[l as usize][i];
                    self.visit_sub(s, gen);
                }
            }
        }
        dirty.clear();
        self.dirty = dirty;
        while let Some(l) = self.stack.pop() {
            self.comp_links.push(l);
            for i in 0..self.link_subs[l as usize].len() {
                let s = self.link_subs[l as usize][i];
                self.visit_sub(s, gen);
            }
        }
        for i in 0..self.comp_subs.len() {
            let s = self.comp_subs[i];
            self.settle(s);
            let sub = &mut self.subs[s as usize];
            sub.prev_rate = sub.rate;
        }
        match self.cfg.sharing {
            Sharing::MaxMin => self.fill_max_min(gen),
            Sharing::Ports => self.fill_ports(),
        }
        for i in 0..self.comp_subs.len() {
            let s = self.comp_subs[i];
            let sub = &mut self.subs[s as usize];
            if sub.queued && sub.rate == sub.prev_rate {
                // Its queued completion is still right.
                continue;
            }
            // A new version: the completion it had at its old rate no longer counts.
            sub.ver = sub.ver.wrapping_add(1);
            let (rate, rem) = (sub.rate, sub.remaining);
            sub.queued = rem <= 0.0 || rate > 0.0;
            self.seq += 1;
            if rem <= 0.0 {
                self.completions.set(s, self.now, self.seq);
            } else if rate > 0.0 {
                self.completions.set(s, self.now + rem / rate, self.seq);
            } else {
                self.completions.remove(s);
            }
        }
    }

    /// Add flow `s` to the current component (unless it is in already) and its live links to the search.
    pub(super) fn visit_sub(&mut self, s: u32, gen: u32) {
        if self.sub_mark[s as usize] == gen {
            return;
        }
        self.sub_mark[s as usize] = gen;
        self.comp_subs.push(s);
        let sub = &self.subs[s as usize];
        for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
            let l2 = self.paths[j];
            if self.link_mark[l2 as usize] != gen && self.live[l2 as usize] > 0 {
                self.link_mark[l2 as usize] = gen;
                self.stack.push(l2);
            }
        }
    }

    /// [`Sharing::Ports`] in the current component: flows holding their ports keep their path's bottleneck
    /// capacity; the others, oldest first, take their ports when all are idle and wait otherwise.
    pub(super) fn fill_ports(&mut self) {
        let subs = &self.subs;
        self.comp_subs.sort_unstable_by(|&a, &b| {
            let (x, y) = (&subs[a as usize], &subs[b as usize]);
            x.born.total_cmp(&y.born).then(x.task.cmp(&y.task)).then(x.serial.cmp(&y.serial))
        });
        for &l in &self.comp_links {
            self.cnt[l as usize] = 0;
        }
        for i in 0..self.comp_subs.len() {
            let sub = &self.subs[self.comp_subs[i] as usize];
            if sub.serving {
                for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
                    self.cnt[self.paths[j] as usize] = 1;
                }
            }
        }
        for i in 0..self.comp_subs.len() {
            let s = self.comp_subs[i] as usize;
            let (a, b) =
                (self.subs[s].path_start as usize, self.subs[s].path_start as usize + self.subs[s].path_len as usize);
            if !self.subs[s].serving {
                let idle = (a..b).all(|j| {
                    let l = self.paths[j] as usize;
                    !self.is_port[l] || self.cnt[l] == 0
                });
                if !idle {
                    self.subs[s].rate = 0.0;
                    continue;
                }
                for j in a..b {
                    self.cnt[self.paths[j] as usize] = 1;
                }
                self.subs[s].serving = true;
            }
            self.subs[s].rate = (a..b).map(|j| self.cap[self.paths[j] as usize]).fold(f64::INFINITY, f64::min);
        }
    }

    /// Weighted max-min fair rates (progressive filling) in the current component.
    pub(super) fn fill_max_min(&mut self, gen: u32) {
        if self.alone_ok && self.comp_links.iter().all(|&l| self.link_subs[l as usize].len() <= 1) {
            self.fill_alone(gen);
            return;
        }
        // Progressive filling.
        let mut active = std::mem::take(&mut self.active);
        active.clear();
        for &l in &self.comp_links {
            let n = self.link_subs[l as usize].len() as u32;
            if n > 0 {
                self.cap_rem[l as usize] = self.cap[l as usize];
                self.cnt[l as usize] = n;
                self.wsum[l as usize] = self.link_subs[l as usize].iter().map(|&s| self.subs[s as usize].weight).sum();
                active.push(l);
            }
        }
        let mut unfrozen = self.comp_subs.len();
        while unfrozen > 0 && !active.is_empty() {
            self.round = self.round.wrapping_add(1);
            if self.round == 0 {
                self.touched.iter_mut().for_each(|m| *m = 0);
                self.round = 1;
            }
            let round = self.round;
            let mut best = f64::INFINITY;
            for &l in &active {
                let share = self.cap_rem[l as usize].max(0.0) / self.wsum[l as usize];
                self.share[l as usize] = share;
                best = best.min(share);
            }
            let lim = best * (1.0 + 1e-9);
            let mut i = 0;
            while i < active.len() {
                let l = active[i];
                // The share as of now: the one computed above unless a flow frozen since changed the link.
                let share = if self.touched[l as usize] == round {
                    self.cap_rem[l as usize].max(0.0) / self.wsum[l as usize]
                } else {
                    self.share[l as usize]
                };
                if share <= lim {
                    for k in 0..self.link_subs[l as usize].len() {
                        let s = self.link_subs[l as usize][k];
                        if self.frozen[s as usize] == gen {
                            continue;
                        }
                        self.frozen[s as usize] = gen;
                        unfrozen -= 1;
                        let w = self.subs[s as usize].weight;
                        let rate = best * w;
                        self.subs[s as usize].rate = rate;
                        let sub = &self.subs[s as usize];
                        for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
                            let l2 = self.paths[j] as usize;
                            if self.link_mark[l2] != gen {
                                // A gated link out of the computation.
                                continue;
                            }
                            self.cap_rem[l2] -= rate;
                            self.cnt[l2] -= 1;
                            self.wsum[l2] -= w;
                            self.touched[l2] = round;
                        }
                    }
                }
                i += 1;
            }
            active.retain(|&l| self.cnt[l as usize] > 0);
        }
        self.active = active;
    }

    /// [`Sim::fill_max_min`] when no two flows of the component share a link: the same rounds, computed per flow.
    /// A link's share is then its capacity over its one flow's weight, and freezing a flow touches no other
    /// flow's links, so a round freezes (at the round's least share times its weight) every flow whose least
    /// share is within the tolerance of that round's least share.
    pub(super) fn fill_alone(&mut self, gen: u32) {
        // Per flow with a link in the computation: its least share, or `NAN` once it is frozen.
        let mut least = std::mem::take(&mut self.least);
        least.clear();
        let mut unfrozen = 0usize;
        for &s in &self.comp_subs {
            let sub = &self.subs[s as usize];
            let mut m = f64::INFINITY;
            let mut any = false;
            for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
                let l = self.paths[j] as usize;
                if self.link_mark[l] == gen {
                    // (The weight summed over the link's one flow is that weight, exactly.)
                    m = m.min(self.cap[l].max(0.0) / sub.weight);
                    any = true;
                }
            }
            least.push(if any { m } else { f64::NAN });
            unfrozen += usize::from(any);
        }
        while unfrozen > 0 {
            let best = least.iter().copied().filter(|m| !m.is_nan()).fold(f64::INFINITY, f64::min);
            let lim = best * (1.0 + 1e-9);
            for (i, m) in least.iter_mut().enumerate() {
                if *m <= lim {
                    let sub = &mut self.subs[self.comp_subs[i] as usize];
                    sub.rate = best * sub.weight;
                    *m = f64::NAN;
                    unfrozen -= 1;
                }
            }
        }
        self.least = least;
    }
}
