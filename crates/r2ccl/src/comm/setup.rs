//! Starting a communicator's progress thread: its state, the bootstrap and OOB mesh, NIC facts, the
//! UCX transport and the engine, each step with a deadline.

use super::*;

pub(super) struct Progress {
    pub(super) rank: u32,
    pub(super) world: u32,
    pub(super) node_of: Vec<u32>,
    pub(super) mesh: OobMesh,
    /// Readable when a caller or an OOB reader has something for this thread.
    pub(super) wake_rx: WakeReceiver,
    /// Per-NIC `(tx, rx)` byte counts already exported as metrics.
    pub(super) nic_bytes_seen: Vec<(u64, u64)>,
    /// OOB messages sent by channel as of the last export.
    pub(super) oob_sent_seen: [u64; 5],
    pub(super) transport: UcxTransport,
    pub(super) engine: Engine,
    pub(super) shared: Arc<Shared>,
    pub(super) start: Instant,
    pub(super) cfg: Config,
    pub(super) agreed: HealthView,
    /// When every rank switches to a new view (rounds only when a local view changes).
    pub(super) switch: Switch,
    /// The engine's down NICs as last given to `switch` (a change is a new local view).
    pub(super) fed_down: std::collections::BTreeSet<NicId>,
    pub(super) seq: u64,
    /// This rank's argument descriptions waiting for a peer's: (collective, peer) -> text.
    pub(super) descs: BTreeMap<(u64, u32), String>,
    /// Peers' argument descriptions that came before this rank's: (collective, peer) -> text.
    pub(super) peer_descs: BTreeMap<(u64, u32), String>,
    /// The current collective's descriptions to send if it runs for `ARG_CHECK_AFTER`: its
    /// sequence number, when they are due, and (peer, text).
    pub(super) arg_check: Option<(u64, Instant, Descs)>,
    /// This rank's descriptions of its latest collectives (at most `DESCS_KEPT`), by peer
    /// (`u32::MAX`: every peer), to compare with a peer's and name both in a mismatch.
    pub(super) arg_texts: std::collections::VecDeque<(u64, Descs)>,
    /// A digest mismatch this rank saw and told the peer of: the collective, what this rank
    /// knows, and when to tell every rank that if the peer has not named both sides by then.
    pub(super) mismatch_fallback: Option<(u64, String, Instant)>,
    pub(super) broken: Option<CommError>,
    /// Every planning decision: strategy, fallback, pipelining, the plan cache.
    pub(super) planner: r2ccl_policy::Planner,
    /// OOB messages that arrived during init, before the progress loop ran.
    pub(super) early_oob: Vec<OobEvent>,
    pub(super) departed: std::collections::BTreeSet<u32>,
    /// For each departed rank, the last collective it completed (from its goodbye): a
    /// collective after that one can never complete here.
    pub(super) departed_after: std::collections::BTreeMap<u32, u64>,
    /// The last collective this rank completed (its part finished and was delivered).
    pub(super) last_done: u64,
    /// Chunks and frames refused so far (forged, malformed or stray); logged at powers of two.
    pub(super) refused_inputs: u64,
    /// Messages the transport's sweeps dropped from UCX's unexpected queues, as last counted.
    pub(super) swept_seen: u64,
    /// Connection requests the data listeners rejected for presenting no endpoint id of this
    /// communicator's, as last counted.
    pub(super) strangers_seen: u64,
    /// A mismatch at a later collective than the current one, applied when the current one is
    /// over or at the instant given (see the `Abort` handler).
    pub(super) deferred_break: Option<(CommError, Instant)>,
    /// This rank's node name and data interfaces, the labels of its NIC metrics.
    /// This communicator's series and their labels.
    pub(super) metrics: crate::metrics::CommMetrics,
}

/// Argument descriptions by peer: (rank, text).
pub(super) type Descs = Vec<(u32, String)>;

pub(super) struct Current {
    pub(super) seq: u64,
    pub(super) reply: Sender<Reply>,
    /// The caller's borrowed output buffer (written here, never after the reply, and only
    /// under `access`).
    pub(super) borrowed: Option<(*mut u8, usize)>,
    /// Guards `borrowed`.
    pub(super) access: Option<Access>,
    /// The collective ran on registered memory: its result is in place already.
    pub(super) registered: bool,
    pub(super) out_len: usize,
    /// The collective's name (`all_reduce`, ..., `group`), for metrics.
    pub(super) name: &'static str,
    /// Its size as nccl-tests counts it (the larger of input and output), and the bus factor.
    pub(super) bytes: u64,
    pub(super) bus_factor: f64,
    pub(super) strategy: Schedule,
    pub(super) epoch: u64,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
}

impl Progress {
    pub(super) fn init(
        opts: CommOptions,
        root_listener: Option<TcpListener>,
        shared: Arc<Shared>,
        wake_rx: WakeReceiver,
    ) -> Result<Self, CommError> {
        let cfg = opts.config.clone();
        let deadline = Instant::now() + Duration::from_millis(cfg.bootstrap.connect_timeout_ms);
        raise_nofile_limit(opts.rank, opts.world, opts.nics.len());
        let bind_ip = if cfg.bootstrap.oob_iface.is_empty() {
            oob_bind_addr(&opts.root)
        } else {
            let spec = &cfg.bootstrap.oob_iface;
            let (iface, ip) = crate::netif::select_oob(spec, &crate::netif::ipv4_addresses()).ok_or_else(|| {
                CommError::Invalid(format!(
                    "bootstrap.oob_iface `{spec}` (R2CCL_OOB_IFACE) matches no interface with an IPv4 address here"
                ))
            })?;
            if &iface != spec {
                tracing::info!(target: subsys::INIT, spec = %spec, %iface, %ip, "OOB interface from bootstrap.oob_iface");
            }
            IpAddr::V4(ip)
        };
        let oob = TcpListener::bind((bind_ip, 0))
            .map_err(|e| CommError::Bootstrap(format!("OOB listener on {bind_ip}: {e}")))?;
        let oob_addr = oob.local_addr().map_err(|e| CommError::Bootstrap(e.to_string()))?.to_string();
        // `topo.file`: this node's entry gives NIC rates and NUMA nodes that discovery may not see.
        let file_node = if cfg.topo.file.is_empty() { None } else { Some(topo_file_node(&cfg.topo.file, &opts.node)?) };
        let me = PeerInfo {
            rank: opts.rank,
            node: opts.node.clone(),
            oob_addr,
            blob: nic_blob(&nic_facts(&opts.nics, cfg.transport.nic_speed_mbps, file_node.as_ref())),
        };
        let table = if opts.rank == 0 {
            let addr = opts
                .root
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| CommError::Invalid(format!("cannot resolve rendezvous address {}", opts.root)))?;
            let root = match root_listener {
                Some(l) => Root::from_listener(l, opts.secret.clone()),
                None => Root::bind(addr, opts.secret.clone()).map_err(|e| CommError::Bootstrap(e.to_string()))?,
            };
            let (table, stats) = root.run(opts.world, me, deadline).map_err(|e| CommError::Bootstrap(e.to_string()))?;
            if stats.rejected > 0 {
                crate::metrics::count_rejected("bootstrap", stats.rejected);
            }
            table
        } else {
            join(&opts.root, &opts.secret, opts.world, me, deadline).map_err(|e| CommError::Bootstrap(e.to_string()))?
        };
        // Node numbering: by first appearance in rank order, identical on every rank.
        let mut names: Vec<&str> = Vec::new();
        let node_of: Vec<u32> = table
            .iter()
            .map(|p| match names.iter().position(|n| *n == p.node) {
                Some(i) => i as u32,
                None => {
                    names.push(&p.node);
                    (names.len() - 1) as u32
                }
            })
            .collect();
        let nic_counts: Vec<u32> =
            table.iter().map(|p| p.blob.get(..4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect();
        if nic_counts.iter().any(|&k| k as usize != opts.nics.len()) {
            return Err(CommError::Invalid(format!("ranks disagree on the number of data NICs: {nic_counts:?}")));
        }
        let mesh = OobMesh::establish(
            oob,
            opts.rank,
            &table,
            &opts.secret,
            Duration::from_millis(cfg.bootstrap.peer_timeout_ms),
            deadline,
        )
        .map_err(|e| CommError::Bootstrap(e.to_string()))?;
        let node = NodeId(node_of[opts.rank as usize]);
        // This communicator's chunk-header key and id: from the secret and the random session
        // nonce rank 0 put in the authenticated table (docs/security.md). The data listeners admit
        // only the endpoint ids derived from the key.
        let (header_key, comm_id) = crate::bootstrap_mac::data_keys(&opts.secret, &table.session);
        let mut ucfg = UcxTransportConfig {
            rank: Rank(opts.rank),
            node,
            nics: opts
                .nics
                .iter()
                .map(|d| ContextConfig {
                    rx_segment: usize::try_from(cfg.transport.tcp_rx_segment_bytes).ok(),
                    ..ContextConfig::tcp(d.clone())
                })
                .collect(),
            faults: Vec::new(),
            link_monitor: true,
            endpoints: Some(EndpointAuth { key: header_key.clone(), world: opts.world }),
        };
        if opts.env_faults {
            ucfg = ucfg.with_env_faults().map_err(|e| CommError::Invalid(format!("R2CCL_FAULT: {e}")))?;
        }
        let mut transport = UcxTransport::open(ucfg).map_err(|e| CommError::Transport(e.to_string()))?;
        crate::metrics::set_build_info(
            &r2ccl_ucx::UcxVersion::built().map(|v| v.to_string()).unwrap_or_default(),
            &r2ccl_ucx::UcxVersion::loaded().to_string(),
        );
        let blob = transport.local_address_blob().map_err(|e| CommError::Transport(e.to_string()))?;
        // Allgather of UCX addresses over the OOB mesh.
        let (channel, payload) = Msg::Address(blob.clone()).encode();
        mesh.broadcast(channel, &payload);
        let mut blobs: Vec<Option<Vec<u8>>> = vec![None; opts.world as usize];
        blobs[opts.rank as usize] = Some(blob);
        // Faster ranks may already send collective traffic (views, argument checks): keep it
        // for the progress loop; the address is the one `Msg::Address` a rank sends.
        let mut early_oob = Vec::new();
        while blobs.iter().any(Option::is_none) {
            match mesh.recv_deadline(deadline) {
                Some(OobEvent::Message { from, channel, payload })
                    if blobs.get(from as usize).is_some_and(Option::is_none) =>
                {
                    match Msg::decode(channel, &payload) {
                        Ok(Msg::Address(blob)) => blobs[from as usize] = Some(blob),
                        _ => early_oob.push(OobEvent::Message { from, channel, payload }),
                    }
                }
                Some(OobEvent::PeerLost { rank, why }) => return Err(CommError::PeerLost { rank: Rank(rank), why }),
                Some(ev) => early_oob.push(ev),
                None => {
                    let missing: Vec<usize> =
                        blobs.iter().enumerate().filter(|(_, b)| b.is_none()).map(|(i, _)| i).collect();
                    return Err(CommError::Bootstrap(format!(
                        "no transport address from rank(s) {missing:?} by the deadline"
                    )));
                }
            }
        }
        let blobs: Vec<Vec<u8>> = blobs.into_iter().flatten().collect();
        transport.connect_peers(&blobs).map_err(|e| CommError::Transport(e.to_string()))?;
        let nodes = names.len();
        let nics = opts.nics.len();
        // The cluster as r2ccl-topo models it, from what the first rank of each node announced
        // (its NICs' rates and NUMA nodes): the one source of the transport's backup chains, the
        // planner's cost model and the health view, the same on every rank.
        let facts: Vec<Vec<NicFacts>> = (0..nodes)
            .map(|n| {
                let first = node_of.iter().position(|&x| x as usize == n);
                first.and_then(|r| table.get(r)).and_then(|p| blob_facts(&p.blob)).unwrap_or_default()
            })
            .collect();
        let cluster = communicator_cluster(&names, &node_of, &opts.nics, &facts)?;
        let topo = Topology::try_from(&cluster).map_err(|e| CommError::Invalid(e.to_string()))?;
        // Progress deadline: the margin plus the time a full window of chunks takes at a
        // pessimistic 100 MB/s (a loaded host must not look like a black hole).
        let stall_timeout = Duration::from_millis(
            cfg.detect.progress_margin_ms
                + cfg.transport.chunk_bytes * u64::from(cfg.transport.max_inflight_chunks) / 100_000,
        );
        // A slow peer (a busy or descheduled process) must be given time to answer before
        // its path counts as dead; a silent black hole is still declared within a second.
        let probe_timeout = (2 * stall_timeout).max(Duration::from_millis(500));
        let ecfg = EngineConfig {
            comm: comm_id,
            header_key,
            stall_timeout,
            session: SessionConfig {
                chunk_size: u32::try_from(cfg.transport.chunk_bytes).unwrap_or(1 << 20),
                window: cfg.transport.max_inflight_chunks,
                // Chunks of a step the receiver has not reached yet wait here; beyond it they
                // are dropped and replayed on request (Nack), never lost.
                max_early_bytes: 512 << 20,
                ..SessionConfig::default()
            },
            probe_interval: Duration::from_millis(cfg.detect.probe_interval_ms),
            probe_timeout,
            migrate_retry: Duration::from_millis(cfg.detect.oob_retry_ms.max(10)),
            // UcxTransport connects rail r to the peers' rail r only.
            rail_only: true,
            detect: detect_config(&cfg.detect),
            no_path_timeout: Duration::from_millis(cfg.detect.no_path_timeout_ms),
        };
        let mut engine =
            Engine::new(Rank(opts.rank), opts.world, ecfg, topo).map_err(|e| CommError::Transport(e.to_string()))?;
        let mut agreed = cluster.health_view();
        // NICs that could not be opened when their rank started are failed from the first
        // collective on; every rank derives the same set from the same address blobs.
        let dead = transport.dead_nics();
        for nic in &dead {
            let _ = agreed.set_failed(*nic);
            engine.mark_nic_down(Duration::ZERO, &mut transport, *nic);
        }
        if let Ok(mut f) = shared.failed.lock() {
            *f = agreed.failed_nics();
        }
        if !dead.is_empty() {
            let names: Vec<String> = dead.iter().map(ToString::to_string).collect();
            tracing::warn!(target: subsys::INIT, rank = opts.rank, nics = ?names, "NICs unusable since the start; planning without them");
        }
        let planner =
            r2ccl_policy::Planner::for_communicator(Rank(opts.rank), &cluster, cfg.policy.rerank, &cfg.policy.strategy)
                .map_err(|e| CommError::Invalid(e.to_string()))?;
        // Only this node's NICs: every rank exporting every node's would make the job's series
        // grow with the square of its size.
        let my_node = node_of.get(opts.rank as usize).copied().unwrap_or(0);
        let metrics = crate::metrics::CommMetrics::new(comm_id, &opts.node, &opts.nics);
        for r in 0..opts.nics.len() {
            let dead = dead.iter().any(|n| n.node.0 == my_node && usize::from(n.rail.0) == r);
            metrics.nic_up(r as u16, !dead);
        }
        metrics.epoch(agreed.epoch().0, false);
        if opts.rank == 0 && !cfg.topo.dump_file.is_empty() {
            match dump_cluster_view(&cfg.topo.dump_file, &cluster) {
                Ok(()) => tracing::info!(target: subsys::TOPO, file = %cfg.topo.dump_file, "cluster view written"),
                Err(e) => {
                    tracing::warn!(target: subsys::TOPO, file = %cfg.topo.dump_file, error = %e, "cluster view not written")
                }
            }
        }
        let nic_mbps: Vec<u64> =
            cluster.nodes().first().map(|n| n.nics.iter().map(|x| x.speed_mbps).collect()).unwrap_or_default();
        tracing::info!(target: subsys::INIT, rank = opts.rank, world = opts.world, nodes, nics, ?nic_mbps, "communicator ready");
        let switch_retry = Duration::from_millis(cfg.detect.oob_retry_ms.max(10));
        let progress = Self {
            rank: opts.rank,
            world: opts.world,
            node_of,
            mesh,
            transport,
            engine,
            shared,
            start: Instant::now(),
            cfg,
            switch: Switch::new(opts.rank, opts.world, agreed.clone(), switch_retry),
            fed_down: dead.iter().copied().collect(),
            agreed,
            seq: 0,
            descs: BTreeMap::new(),
            peer_descs: BTreeMap::new(),
            arg_check: None,
            arg_texts: std::collections::VecDeque::new(),
            mismatch_fallback: None,
            broken: None,
            planner,
            early_oob,
            departed: std::collections::BTreeSet::new(),
            departed_after: std::collections::BTreeMap::new(),
            last_done: 0,
            refused_inputs: 0,
            swept_seen: 0,
            strangers_seen: 0,
            deferred_break: None,
            metrics,
            wake_rx,
            nic_bytes_seen: Vec::new(),
            oob_sent_seen: [0; 5],
        };
        progress.export_nic_capacity(&progress.agreed);
        Ok(progress)
    }
}

/// Write the communicator's cluster model to `path` as a topology description that `r2ccl-topo`
/// loads back (`R2CCL_TOPO_DUMP_FILE`).
pub(super) fn dump_cluster_view(path: &str, cluster: &r2ccl_topo::ClusterTopology) -> Result<(), String> {
    let contiguous = cluster.ranks().windows(2).all(|w| w[1].node.0 == w[0].node.0 || w[1].node.0 == w[0].node.0 + 1);
    if !contiguous {
        return Err("ranks are not numbered node by node; the description format needs that".into());
    }
    r2ccl_topo::write_cluster_view(std::path::Path::new(path), cluster, None).map_err(|e| e.to_string())
}

/// The shortest probe timeout the communicator's detector uses (localization and re-probes).
pub(super) const DETECT_PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// The `verdict` label of the failover metric.
pub(super) const fn verdict_label(v: r2ccl_detect::Verdict) -> &'static str {
    match v {
        r2ccl_detect::Verdict::LocalNic(_) => "local_nic",
        r2ccl_detect::Verdict::RemoteNic(_) => "remote_nic",
        r2ccl_detect::Verdict::Link { .. } => "link",
        r2ccl_detect::Verdict::Transient => "transient",
    }
}

/// The `method` label of `r2ccl_detector_verdicts_total`.
pub(super) const fn method_label(m: r2ccl_detect::Method) -> &'static str {
    match m {
        r2ccl_detect::Method::LocalEvidence => "local_evidence",
        r2ccl_detect::Method::Triangulated => "triangulated",
        r2ccl_detect::Method::BothDirectionsOk => "both_directions_ok",
        r2ccl_detect::Method::TwoNodeFallback => "two_node_fallback",
    }
}

/// The detector's settings from the `[detect]` section. Its probes wait at least
/// [`DETECT_PROBE_TIMEOUT`], so a busy host's late answer does not blame a healthy NIC;
/// re-probes are at least 50 ms further apart than that, localization waits for the probes
/// plus two OOB resends, and the first hold-down outlasts localization by 50 ms (the detector
/// requires each of these orders).
pub(super) fn detect_config(d: &r2ccl_config::DetectConfig) -> r2ccl_detect::DetectConfig {
    let ms = Duration::from_millis;
    let probe_timeout = DETECT_PROBE_TIMEOUT.max(ms(d.probe_timeout_ms));
    let localize_timeout = (probe_timeout + 2 * ms(d.oob_retry_ms)).max(ms(d.localize_timeout_ms));
    // The detector needs localization to end before the hold-down does.
    let holddown_base = ms(d.holddown_base_ms).max(localize_timeout + ms(50));
    r2ccl_detect::DetectConfig {
        progress_margin: ms(d.progress_margin_ms),
        heartbeat_interval: ms(d.heartbeat_interval_ms),
        heartbeat_misses: d.heartbeat_misses,
        probe_timeout,
        localize_timeout,
        oob_retry: ms(d.oob_retry_ms),
        oob_max_retries: d.oob_max_retries,
        probe_interval: ms(d.probe_interval_ms).max(probe_timeout + ms(50)),
        good_probes: d.good_probes,
        holddown_base,
        holddown_max: ms(d.holddown_max_ms).max(holddown_base),
        flap_window: ms(d.flap_window_ms),
    }
}

/// The communicator's cluster as r2ccl-topo models it: node `n` named `names[n]` with one NIC per
/// rail named after this rank's `nics`, at the rate and on the NUMA node `facts[n][rail]` (what the
/// node's first rank announced; a rate it did not give is [`NIC_MBPS`]), rank `r` on node
/// `node_of[r]`. Backup chains come from it ([`r2ccl_topo::NodeTopology::backup_chain`]: the same
/// NUMA node first, then the others, each group in rail order starting after the NIC).
pub(super) fn communicator_cluster(
    names: &[&str],
    node_of: &[u32],
    nics: &[String],
    facts: &[Vec<NicFacts>],
) -> Result<r2ccl_topo::ClusterTopology, CommError> {
    let nodes = names
        .iter()
        .enumerate()
        .map(|(n, name)| {
            let node_facts = facts.get(n).map_or(&[][..], Vec::as_slice);
            let rails: Vec<(&str, u64, Option<u32>)> = nics
                .iter()
                .enumerate()
                .map(|(r, nic)| {
                    let f = node_facts.get(r);
                    let mbps = f.map(|f| f.mbps).filter(|&m| m > 0).unwrap_or(NIC_MBPS);
                    (nic.as_str(), mbps, f.and_then(|f| f.numa))
                })
                .collect();
            r2ccl_topo::NodeTopology::from_nics(*name, &rails)
        })
        .collect();
    let placement: Vec<NodeId> = node_of.iter().map(|&n| NodeId(n)).collect();
    r2ccl_topo::ClusterTopology::with_ranks_on(Some("r2ccl-communicator".into()), nodes, &placement)
        .map_err(|e| CommError::Invalid(format!("cluster model: {e}")))
}

/// NIC rate assumed when neither `transport.nic_speed_mbps` nor the driver gives one, Mbit/s.
pub(super) const NIC_MBPS: u64 = 100_000;

/// What a rank tells the others about each of its data NICs at bootstrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NicFacts {
    /// Line rate, Mbit/s.
    pub(super) mbps: u64,
    /// NUMA node, if known.
    pub(super) numa: Option<u32>,
}

/// The facts of this rank's data NICs: the rate is `configured` when set, else the one in
/// `file` (the node's `topo.file` entry, matched by interface name), else what the driver
/// reports in sysfs, else [`NIC_MBPS`]; the NUMA node comes from `file`, else sysfs.
pub(super) fn nic_facts(nics: &[String], configured: u64, file: Option<&r2ccl_topo::NodeTopology>) -> Vec<NicFacts> {
    nics.iter()
        .map(|name| {
            let listed = file.and_then(|n| n.nics.iter().find(|x| x.name == *name));
            let found = r2ccl_topo::discover::sysfs::read_interface(std::path::Path::new("/sys"), name).ok();
            let mbps = if configured > 0 {
                configured
            } else {
                listed.map(|x| x.speed_mbps).or_else(|| found.as_ref().and_then(|d| d.speed_mbps)).unwrap_or(NIC_MBPS)
            };
            let numa = listed.and_then(|x| x.numa).or_else(|| found.as_ref().and_then(|d| d.numa));
            NicFacts { mbps, numa }
        })
        .collect()
}

/// How many collectives ahead of this rank a peer's argument descriptions are kept (a peer sends
/// one only from a collective that ran `ARG_CHECK_AFTER`, or after a digest mismatch, and is
/// rarely ahead by more than one; the rest is dropped and counted): at most this many, per peer,
/// of at most 4 KiB each.
pub(super) const PEER_AHEAD: u64 = 64;

/// NUMA node "unknown" in a blob.
pub(super) const NO_NUMA: u32 = u32::MAX;

/// A rank's bootstrap blob: its number of data NICs (u32), then each NIC's rate in Mbit/s
/// (u64), then each NIC's NUMA node (u32, [`NO_NUMA`] when unknown).
pub(crate) fn nic_blob(facts: &[NicFacts]) -> Vec<u8> {
    let mut blob = (facts.len() as u32).to_le_bytes().to_vec();
    for f in facts {
        blob.extend_from_slice(&f.mbps.to_le_bytes());
    }
    for f in facts {
        blob.extend_from_slice(&f.numa.unwrap_or(NO_NUMA).to_le_bytes());
    }
    blob
}

/// The NIC facts in a peer's blob ([`nic_blob`]); `None` when it is malformed.
pub(crate) fn blob_facts(blob: &[u8]) -> Option<Vec<NicFacts>> {
    let (count, rest) = blob.split_first_chunk::<4>()?;
    let count = u32::from_le_bytes(*count) as usize;
    if rest.len() != count.checked_mul(12)? {
        return None;
    }
    let (speeds, numas) = rest.split_at(count * 8);
    let speeds = speeds.chunks_exact(8).filter_map(|b| <[u8; 8]>::try_from(b).ok().map(u64::from_le_bytes));
    let numas = numas.chunks_exact(4).filter_map(|b| <[u8; 4]>::try_from(b).ok().map(u32::from_le_bytes));
    Some(speeds.zip(numas).map(|(mbps, n)| NicFacts { mbps, numa: (n != NO_NUMA).then_some(n) }).collect())
}

/// `topo.file`: the entry of host `node` (`R2CCL_NODE` or the host name) in the static
/// topology description at `path`.
pub(super) fn topo_file_node(path: &str, node: &str) -> Result<r2ccl_topo::NodeTopology, CommError> {
    let cluster = r2ccl_topo::load_cluster_file(std::path::Path::new(path))
        .map_err(|e| CommError::Invalid(format!("topo.file {path}: {e}")))?;
    cluster.nodes().iter().find(|n| n.hostname == node).cloned().ok_or_else(|| {
        let listed: Vec<&str> = cluster.nodes().iter().map(|n| n.hostname.as_str()).collect();
        CommError::Invalid(format!(
            "topo.file {path} has no node {node:?} (R2CCL_NODE, else the host name); it lists {listed:?}"
        ))
    })
}

/// The data NICs of a `topo.file` node entry, in rail order.
pub(super) fn file_nics(node: &r2ccl_topo::NodeTopology) -> Vec<String> {
    let mut nics: Vec<&r2ccl_topo::Nic> = node.nics.iter().collect();
    nics.sort_by_key(|n| n.rail);
    nics.into_iter().map(|n| n.name.clone()).collect()
}

/// Progress rounds without movement before the progress thread sleeps.
pub(super) const IDLE_SPINS: u32 = 8;
/// Longest sleep of an idle progress thread while calls are running or queued (bounds every
/// timer's lateness during a collective).
pub(super) const IDLE_WAIT: Duration = Duration::from_millis(1);
/// Longest sleep once no call has run or waited for [`QUIET_AFTER`]: an idle communicator
/// sleeps until its next timer (the engine's heartbeats and probes of idle paths, the health
/// switch's resends, a silent OOB peer's deadline), at most this long, instead of waking 1,000
/// times a second; UCX, OOB and caller events wake it at once.
pub(super) const QUIET_WAIT: Duration = Duration::from_secs(1);
/// How long after its last call a communicator counts as quiet.
pub(super) const QUIET_AFTER: Duration = Duration::from_millis(100);

/// Descriptors a rank of `world` with `nics` data NICs holds: an OOB connection per peer, and per
/// NIC and peer a data and a probe endpoint each way (UCX TCP: a socket each), plus slack for
/// the process's own files.
pub(super) const fn nofile_needed(world: u32, nics: usize) -> u64 {
    let peers = world.saturating_sub(1) as u64;
    peers + 4 * nics as u64 * peers + 256
}

/// The soft `RLIMIT_NOFILE` to set for `needed` descriptors under limits `(soft, hard)`: `None`
/// when the soft one suffices, else the smaller of `needed` and the hard limit.
pub(super) fn nofile_target(soft: u64, hard: u64, needed: u64) -> Option<u64> {
    (soft < needed).then(|| needed.min(hard)).filter(|&t| t > soft)
}

/// Raise the soft descriptor limit when this communicator needs more than it allows (the default
/// of 1,024 is reached from 87 ranks with 2 NICs); never above the hard limit, which only
/// the administrator raises: short of it, a warning says what to raise.
fn raise_nofile_limit(rank: u32, world: u32, nics: usize) {
    let needed = nofile_needed(world, nics);
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let (soft, hard) = (lim.rlim_cur, lim.rlim_max);
    if let Some(target) = nofile_target(soft, hard, needed) {
        let new = libc::rlimit { rlim_cur: target, rlim_max: hard };
        // SAFETY: setrlimit reads the struct it is given, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            tracing::info!(target: subsys::INIT, rank, from = soft, to = target, needed, "raised the soft RLIMIT_NOFILE");
        }
    }
    if hard < needed {
        tracing::warn!(target: subsys::INIT, rank, hard, needed, "RLIMIT_NOFILE's hard limit is below the descriptors this communicator may hold: raise it (ulimit -Hn, or LimitNOFILE= in systemd)");
    }
}
