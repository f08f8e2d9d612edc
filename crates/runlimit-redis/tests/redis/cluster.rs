//! Both limiters on a three-primary Redis Cluster the test starts itself
//! (`redis-server --cluster-enabled yes` on free loopback ports, joined with
//! `redis-cli --cluster create`), stopped when the test ends.
//!
//! One test runs every scenario in turn on one cluster: single checks spread over every shard
//! (so over every primary) under per-shard placement, same-slot batches, the cross-shard batch
//! refused before any I/O, single-slot placement's batches across shards, a counter shared by
//! limiters that first contacted different nodes, and a redirection answered by a node that
//! does not own the slot (not consumed, not followed, the slot map read again).

use crate::support;

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use runlimit_core::{
    BatchDecisionView, Check, ConsumptionStatus, DecisionView, FixedWindowPolicy, GcraPolicy, PolicyId,
    ScopeId,
};
use runlimit_redis::{
    BatchCheckError, CheckError, KeyPrefix, Placement, RedisConfig, RedisGcraLimiter, RedisLimiter,
};

/// A process killed (and reaped) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port that is free, as is its cluster-bus port (port + 10,000).
fn free_port() -> u16 {
    loop {
        let port =
            TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("address").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn tool(name: &str) -> &str {
    if Command::new(name).arg("--version").output().is_err() {
        panic!(
            "{name} is not installed: the cluster test starts its own Redis Cluster (Debian/Ubuntu: apt-get install redis-server)"
        );
    }
    name
}

/// Three primaries, slots assigned, `cluster_state:ok` everywhere; stopped and removed on drop.
struct Cluster {
    ports: Vec<u16>,
    servers: Vec<Process>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.servers.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    fn start() -> Self {
        let server = tool("redis-server");
        let dir = std::env::temp_dir().join(format!("runlimit-redis-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let servers = ports
            .iter()
            .map(|port| {
                let config = dir.join(format!("nodes-{port}.conf"));
                Process(
                    Command::new(server)
                        .args([
                            "--bind",
                            "127.0.0.1",
                            "--port",
                            &port.to_string(),
                            "--cluster-enabled",
                            "yes",
                        ])
                        .args(["--cluster-config-file", config.to_str().expect("UTF-8 path")])
                        .args([
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                            "--dir",
                            dir.to_str().expect("UTF-8 path"),
                        ])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start redis-server"),
                )
            })
            .collect();
        for port in &ports {
            wait_for(|| redis_cli(*port, &["PING"]) == "PONG", "a cluster node to answer PING");
        }
        let mut create = Command::new(tool("redis-cli"));
        create.arg("--cluster").arg("create");
        for port in &ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let output = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        for port in &ports {
            wait_for(
                || redis_cli(*port, &["CLUSTER", "INFO"]).contains("cluster_state:ok"),
                "cluster_state:ok",
            );
        }
        Self { ports, servers, dir }
    }

    fn url(&self, node: usize) -> String {
        format!("redis://127.0.0.1:{}", self.ports[node])
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let output =
        Command::new("redis-cli").args(["-p", &port.to_string()]).args(args).output().expect("redis-cli");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn fixed(id: &str, limit: u64) -> FixedWindowPolicy {
    FixedWindowPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("cluster").unwrap(),
        limit,
        Duration::from_secs(600),
    )
    .unwrap()
}

fn config(prefix: &str, placement: Placement) -> RedisConfig {
    RedisConfig::default().with_key_prefix(KeyPrefix::new(prefix).unwrap()).with_placement(placement)
}

/// `available` of an allowed decision.
fn available(decision: &runlimit_core::Decision) -> u64 {
    match decision.view() {
        DecisionView::Allowed { allowance } => allowance.available(),
        _ => panic!("expected an allowed decision, got {decision:?}"),
    }
}

#[test]
#[ignore = "starts a three-primary Redis Cluster (needs redis-server and redis-cli)"]
fn both_limiters_on_a_three_primary_cluster() {
    let cluster = Cluster::start();
    support::runtime().block_on(async {
        // Per-shard placement: single checks in all 256 shards, over every primary.
        let limiter =
            RedisLimiter::new(&cluster.url(0)).unwrap().with_config(config("spread", Placement::PerShard));
        limiter.prepare().await.expect("prepare on the cluster");
        let policy = fixed("cluster.single", 2);
        for shard in 0..=u8::MAX {
            let check = Check::new(support::subject_in(shard, 1).bind(&policy));
            assert_eq!(available(&limiter.check(&check).await.unwrap()), 1, "shard {shard}");
            assert_eq!(available(&limiter.check(&check).await.unwrap()), 0, "shard {shard}");
            assert!(!limiter.check(&check).await.unwrap().permits_request(), "shard {shard}");
        }
        let keys: Vec<u64> =
            cluster.ports.iter().map(|port| redis_cli(*port, &["DBSIZE"]).parse().expect("DBSIZE")).collect();
        assert!(keys.iter().all(|count| *count > 0), "every primary holds shards: {keys:?}");

        // A same-slot batch: one subject key bound to two policies (one shard).
        let (minute, day) = (fixed("cluster.minute", 3), fixed("cluster.day", 10));
        let subject = support::subject_in(0x42, 7);
        let batch = [Check::new(subject.bind(&minute)), Check::new(subject.bind(&day))];
        match limiter.check_all(&batch).await.unwrap().view() {
            BatchDecisionView::Allowed { allowances } => {
                assert_eq!(allowances.iter().map(|a| a.available()).collect::<Vec<_>>(), [2, 9]);
            }
            other => panic!("expected an allowed batch, got {other:?}"),
        }
        // A batch across shards cannot be one script: refused before any I/O.
        let across = [
            Check::new(support::subject_in(0x01, 1).bind(&minute)),
            Check::new(support::subject_in(0x02, 1).bind(&minute)),
        ];
        let error = limiter.check_all(&across).await.unwrap_err();
        assert!(
            matches!(error, BatchCheckError::SpansShards { first_shard: 1, other_shard: 2 }),
            "{error:?}"
        );
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(limiter.peek(support::subject_in(0x01, 1).bind(&minute)).await.unwrap().available(), 3);

        // Single-slot placement: any batch, shards included, is atomic on one primary.
        let single = RedisGcraLimiter::new(&cluster.url(1))
            .unwrap()
            .with_config(config("grouped", Placement::SingleSlot));
        single.prepare().await.expect("prepare");
        let gcra = GcraPolicy::new(
            PolicyId::new("cluster.gcra").unwrap(),
            ScopeId::new("cluster").unwrap(),
            10,
            Duration::from_secs(1),
            5,
        )
        .unwrap();
        let batch = [
            Check::new(support::subject_in(0x01, 9).bind(&gcra)),
            Check::new(support::subject_in(0xFE, 9).bind(&gcra)),
        ];
        match single.check_all(&batch).await.unwrap().view() {
            BatchDecisionView::Allowed { allowances } => {
                assert_eq!(allowances.iter().map(|a| a.available()).collect::<Vec<_>>(), [4, 4]);
            }
            other => panic!("expected an allowed batch, got {other:?}"),
        }

        // One counter, whichever node each limiter first contacted.
        let policy = fixed("cluster.shared", 5);
        let limiters: Vec<RedisLimiter> = (0..3)
            .map(|node| {
                RedisLimiter::new(&cluster.url(node))
                    .unwrap()
                    .with_config(config("shared", Placement::PerShard))
            })
            .collect();
        for limiter in &limiters {
            limiter.prepare().await.expect("prepare");
        }
        let check = Check::new(support::subject_in(0x99, 3).bind(&policy));
        let mut left = Vec::new();
        for round in 0..5 {
            left.push(available(&limiters[round % 3].check(&check).await.unwrap()));
        }
        assert_eq!(left, [4, 3, 2, 1, 0]);
        assert!(!limiters[2].check(&check).await.unwrap().permits_request());

        // Unprepared, a limiter sends to the URL's node; one that does not own the slot answers
        // MOVED: not consumed, not followed, and the slot map is read for the next admission.
        let probe = "{moved:fw1:10}:probe";
        let owner = cluster
            .ports
            .iter()
            .position(|port| redis_cli(*port, &["SET", probe, "1"]) == "OK")
            .expect("a node owns the slot of shard 0x10");
        assert_eq!(redis_cli(cluster.ports[owner], &["DEL", probe]), "1");
        let subject = support::subject_in(0x10, 1);
        let stranger = (owner + 1) % 3;
        let unprepared = RedisLimiter::new(&cluster.url(stranger))
            .unwrap()
            .with_config(config("moved", Placement::PerShard));
        let policy = fixed("cluster.moved", 2);
        let check = Check::new(subject.bind(&policy));
        let error = unprepared.check(&check).await.unwrap_err();
        assert!(matches!(&error, CheckError::Server { code, .. } if code == "MOVED"), "{error:?}");
        assert_eq!(error.consumption(), ConsumptionStatus::NotConsumed);
        assert_eq!(
            available(&unprepared.check(&check).await.unwrap()),
            1,
            "routed by the refreshed slot map"
        );
    });
}
