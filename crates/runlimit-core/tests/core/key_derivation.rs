//! Known-answer tests for the key derivation.
//!
//! - The HMAC-SHA-256 primitive `KeyHasher` is built on (`hmac::Hmac<sha2::Sha256>`), against
//!   RFC 4231 §4.2–§4.8 (test cases 1–7; case 5 is a 128-bit truncation).
//! - `KeyHasher::hash_for` / `hash_attempt_for` and `PolicyFingerprint::derive`, against the
//!   layouts documented in `key.rs` and `policy.rs`: each expected digest is recomputed here
//!   from hand-built message bytes, and a few are pinned as hex literals (computed with an
//!   independent implementation, Python's `hmac`/`hashlib`) so a silent change of derivation
//!   fails.

use std::time::Duration;

use hex_literal::hex;
use hmac::{Hmac, KeyInit, Mac};
use proptest::prelude::*;
use runlimit_core::{
    FixedWindowPolicy, GcraPolicy, KeyHasher, KeyHasherError, MIN_SECRET_LEN, PolicyFingerprint, PolicyId,
    RateLimitPolicy, ScopeId, SubjectKey, attempts::AttemptPolicy,
};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Policy id, scope id and subject bytes.
type Fields<'a> = (&'a str, &'a str, &'a [u8]);

const SUBJECT_TAG: &[u8] = b"runlimit/subject/v1";
const ATTEMPT_TAG: &[u8] = b"runlimit/attempt-subject/v1";
const FINGERPRINT_TAG: &[u8] = b"runlimit/policy-fingerprint/v1";

/// The secret of the pinned vectors: bytes 0x00..=0x1f.
fn secret() -> [u8; 32] {
    std::array::from_fn(|i| u8::try_from(i).unwrap())
}

fn raw_hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).unwrap();
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// One length-prefixed field: u64 big-endian byte length, then the bytes.
fn push_field(message: &mut Vec<u8>, bytes: &[u8]) {
    message.extend_from_slice(&u64::try_from(bytes.len()).unwrap().to_be_bytes());
    message.extend_from_slice(bytes);
}

fn subject_message(tag: &[u8], id: &str, scope: &str, subject: &[u8]) -> Vec<u8> {
    let mut message = Vec::new();
    push_field(&mut message, tag);
    push_field(&mut message, id.as_bytes());
    push_field(&mut message, scope.as_bytes());
    push_field(&mut message, subject);
    message
}

fn fingerprint_message(kind: &str, id: &str, scope: &str, parameters: &[u64]) -> Vec<u8> {
    let mut message = Vec::new();
    push_field(&mut message, FINGERPRINT_TAG);
    push_field(&mut message, kind.as_bytes());
    push_field(&mut message, id.as_bytes());
    push_field(&mut message, scope.as_bytes());
    for parameter in parameters {
        push_field(&mut message, &parameter.to_be_bytes());
    }
    message
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn fixed(id: &str, scope: &str, limit: u64, window: Duration) -> FixedWindowPolicy {
    FixedWindowPolicy::new(PolicyId::new(id).unwrap(), ScopeId::new(scope).unwrap(), limit, window).unwrap()
}

fn attempt(id: &str, scope: &str) -> AttemptPolicy {
    AttemptPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new(scope).unwrap(),
        Duration::from_secs(1),
        Duration::from_secs(300),
        Duration::from_secs(3_600),
        Duration::from_secs(30),
    )
    .unwrap()
}

fn subject_key<P: RateLimitPolicy>(hasher: &KeyHasher, policy: &P, subject: &[u8]) -> [u8; 32] {
    *hasher.hash_for(policy, subject).into_unbound_subject_key().as_bytes()
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// --- RFC 4231 -------------------------------------------------------------------------------

struct Rfc4231Case {
    name: &'static str,
    key: Vec<u8>,
    data: Vec<u8>,
    /// The full digest, or its leftmost 128 bits for test case 5.
    expected: &'static [u8],
}

fn rfc4231_cases() -> Vec<Rfc4231Case> {
    vec![
        Rfc4231Case {
            name: "4.2 test case 1",
            key: vec![0x0b; 20],
            data: b"Hi There".to_vec(),
            expected: &hex!("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
        },
        Rfc4231Case {
            name: "4.3 test case 2 (key shorter than the output)",
            key: b"Jefe".to_vec(),
            data: b"what do ya want for nothing?".to_vec(),
            expected: &hex!("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        },
        Rfc4231Case {
            name: "4.4 test case 3",
            key: vec![0xaa; 20],
            data: vec![0xdd; 50],
            expected: &hex!("773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
        },
        Rfc4231Case {
            name: "4.5 test case 4",
            key: (0x01..=0x19).collect(),
            data: vec![0xcd; 50],
            expected: &hex!("82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
        },
        Rfc4231Case {
            name: "4.6 test case 5 (truncated to 128 bits)",
            key: vec![0x0c; 20],
            data: b"Test With Truncation".to_vec(),
            expected: &hex!("a3b6167473100ee06e0c796c2955552b"),
        },
        Rfc4231Case {
            name: "4.7 test case 6 (key larger than the block size)",
            key: vec![0xaa; 131],
            data: b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
            expected: &hex!("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
        },
        Rfc4231Case {
            name: "4.8 test case 7 (key and data larger than the block size)",
            key: vec![0xaa; 131],
            data: b"This is a test using a larger than block-size key and a larger than block-size data. \
                    The key needs to be hashed before being used by the HMAC algorithm."
                .to_vec(),
            expected: &hex!("9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
        },
    ]
}

#[test]
fn rfc4231_hmac_sha256_known_answers() {
    for case in rfc4231_cases() {
        let digest = raw_hmac(&case.key, &case.data);
        assert_eq!(&digest[..case.expected.len()], case.expected, "{}", case.name);
        // The same through the verification API, which compares in constant time.
        let mut mac = HmacSha256::new_from_slice(&case.key).unwrap();
        mac.update(&case.data);
        if case.expected.len() == 32 {
            mac.verify_slice(case.expected).unwrap();
        } else {
            mac.verify_truncated_left(case.expected).unwrap();
        }
    }
}

#[test]
fn rfc4231_data_fed_in_pieces_matches() {
    // KeyHasher clones a keyed state and feeds fields piecewise; incremental updates must
    // equal one-shot input.
    for case in rfc4231_cases() {
        let keyed = HmacSha256::new_from_slice(&case.key).unwrap();
        for split in [0, 1, case.data.len() / 2, case.data.len()] {
            let mut mac = keyed.clone();
            mac.update(&case.data[..split]);
            mac.update(&case.data[split..]);
            let digest: [u8; 32] = mac.finalize().into_bytes().into();
            assert_eq!(&digest[..case.expected.len()], case.expected, "{} split {split}", case.name);
        }
    }
}

// --- KeyHasher ------------------------------------------------------------------------------

#[test]
fn secret_length_rule() {
    assert_eq!(MIN_SECRET_LEN, 32);
    for length in [0, 1, 31] {
        assert_eq!(
            KeyHasher::new(&vec![7; length]).unwrap_err(),
            KeyHasherError::SecretTooShort { length, minimum: 32 }
        );
    }
    assert_eq!(
        KeyHasher::new(&[0; 31]).unwrap_err().to_string(),
        "key secret is 31 bytes long, below the minimum of 32"
    );
    for length in [32, 64, 65, 131, 4096] {
        assert!(KeyHasher::new(&vec![7; length]).is_ok(), "{length}");
    }
}

#[test]
fn hash_for_matches_pinned_vectors() {
    let hasher = KeyHasher::new(&secret()).unwrap();
    let login = fixed("auth.login", "identity", 8, Duration::from_secs(60));
    let read = GcraPolicy::new(
        PolicyId::new("api.read").unwrap(),
        ScopeId::new("client").unwrap(),
        10,
        Duration::from_secs(1),
        20,
    )
    .unwrap();
    let tiny = fixed("a", "b", 1, Duration::from_millis(1));

    let cases: [(&[u8; 32], [u8; 32], Fields<'_>); 4] = [
        (
            &hex!("f0da115b8da1053b3bc3b9028b7613cec05c8507b6bda5b70defa1d7634461d4"),
            subject_key(&hasher, &login, b"user@example.test"),
            ("auth.login", "identity", b"user@example.test"),
        ),
        (
            &hex!("ce2ae586ed72b9b5256bbe9cf3e0f2ff22e46adc696d93327ce3751a5e3b7aab"),
            subject_key(&hasher, &read, b"203.0.113.0/24"),
            ("api.read", "client", b"203.0.113.0/24"),
        ),
        (
            &hex!("c96a85b737e687c14da306ff1660532cbb7f4c27a69424d4211e1aa128f2bde9"),
            subject_key(&hasher, &tiny, b""),
            ("a", "b", b""),
        ),
        (
            &hex!("b770002330de896c79f7526caf32eac77e7ece386b2dc028e94549dabbb8e23a"),
            subject_key(&hasher, &login, &[0x00, 0xff, 0x80, 0x0a, 0x00]),
            ("auth.login", "identity", &[0x00, 0xff, 0x80, 0x0a, 0x00]),
        ),
    ];
    for (pinned, derived, (id, scope, subject)) in cases {
        let independent = raw_hmac(&secret(), &subject_message(SUBJECT_TAG, id, scope, subject));
        assert_eq!(&independent, pinned, "independent recomputation of {id}/{scope}");
        assert_eq!(&derived, pinned, "KeyHasher::hash_for for {id}/{scope}");
    }
}

#[test]
fn hash_attempt_for_matches_pinned_vector_and_differs_from_hash_for() {
    let hasher = KeyHasher::new(&secret()).unwrap();
    let policy = attempt("auth.password", "identity");
    let derived = *hasher.hash_attempt_for(&policy, b"user@example.test").subject().as_bytes();
    let pinned = hex!("792c052bcdcaf87bc2f3cdf4b50c5598e39e4c587aebe435f3eba94d0fd03f20");
    assert_eq!(
        raw_hmac(&secret(), &subject_message(ATTEMPT_TAG, "auth.password", "identity", b"user@example.test")),
        pinned
    );
    assert_eq!(derived, pinned);

    // Same id, scope and subject under the quota tag: a different key.
    let quota = fixed("auth.password", "identity", 5, Duration::from_secs(60));
    let quota_key = subject_key(&hasher, &quota, b"user@example.test");
    assert_eq!(
        quota_key,
        raw_hmac(&secret(), &subject_message(SUBJECT_TAG, "auth.password", "identity", b"user@example.test"))
    );
    assert_ne!(quota_key, derived);

    // The attempt subject's storage key pairs the attempt policy's fingerprint with it.
    let subject = hasher.hash_attempt_for(&policy, b"user@example.test");
    assert_eq!(subject.counter_key().fingerprint(), policy.fingerprint());
    assert_eq!(subject.counter_key().subject(), SubjectKey::from_digest(pinned));
    assert_eq!(&subject.counter_key().to_bytes()[32..], &pinned);
}

#[test]
fn long_secret_is_hashed_like_rfc4231_case_6() {
    // Secrets longer than SHA-256's 64-byte block are hashed first (RFC 2104 §2).
    let key = [0xaa; 131];
    let hasher = KeyHasher::new(&key).unwrap();
    let policy = fixed("auth.login", "identity", 8, Duration::from_secs(60));
    let pinned = hex!("ab4b08184e5a3b304d71418d1b4cb4e7dfd1f552d86b731d4223a640ea738811");
    assert_eq!(
        raw_hmac(&key, &subject_message(SUBJECT_TAG, "auth.login", "identity", b"user@example.test")),
        pinned
    );
    assert_eq!(subject_key(&hasher, &policy, b"user@example.test"), pinned);
}

#[test]
fn derivation_differs_across_policy_id_scope_subject_secret_and_tag() {
    let hasher = KeyHasher::new(&secret()).unwrap();
    let other_secret = KeyHasher::new(&[0x55; 32]).unwrap();
    let base = fixed("auth.login", "identity", 8, Duration::from_secs(60));
    let keys = [
        subject_key(&hasher, &base, b"user@example.test"),
        subject_key(
            &hasher,
            &fixed("auth.logout", "identity", 8, Duration::from_secs(60)),
            b"user@example.test",
        ),
        subject_key(
            &hasher,
            &fixed("auth.login", "client", 8, Duration::from_secs(60)),
            b"user@example.test",
        ),
        subject_key(&hasher, &base, b"other@example.test"),
        subject_key(&hasher, &base, b"USER@example.test"),
        subject_key(&other_secret, &base, b"user@example.test"),
        *hasher
            .hash_attempt_for(&attempt("auth.login", "identity"), b"user@example.test")
            .subject()
            .as_bytes(),
    ];
    for (i, a) in keys.iter().enumerate() {
        for (j, b) in keys.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "keys {i} and {j} collide");
        }
    }
}

#[test]
fn counts_and_kind_are_not_part_of_the_subject_key() {
    // Documented: the derivation covers id and scope only; counts, periods and the policy
    // kind live in the fingerprint half of the counter key.
    let hasher = KeyHasher::new(&secret()).unwrap();
    let a = fixed("api.read", "client", 8, Duration::from_secs(60));
    let b = fixed("api.read", "client", 9, Duration::from_secs(1));
    let c = GcraPolicy::new(
        PolicyId::new("api.read").unwrap(),
        ScopeId::new("client").unwrap(),
        10,
        Duration::from_secs(1),
        20,
    )
    .unwrap();
    let key = subject_key(&hasher, &a, b"s");
    assert_eq!(subject_key(&hasher, &b, b"s"), key);
    assert_eq!(subject_key(&hasher, &c, b"s"), key);
    assert_ne!(a.fingerprint(), b.fingerprint());
    assert_ne!(a.fingerprint(), c.fingerprint());
}

#[test]
fn length_prefixes_prevent_field_boundary_ambiguity() {
    let hasher = KeyHasher::new(&secret()).unwrap();
    let window = Duration::from_secs(60);
    // Each pair concatenates to the same bytes without the length prefixes.
    let pairs: [(Fields<'_>, Fields<'_>); 4] = [
        (("ab", "c", b"x"), ("a", "bc", b"x")),
        (("a", "bc", b"d"), ("a", "b", b"cd")),
        (("a.b", "c", b""), ("a.", "bc", b"")),
        (("a", "b", b"c"), ("a", "bc", b"")),
    ];
    for ((id1, scope1, subject1), (id2, scope2, subject2)) in pairs {
        let naive1 = [id1.as_bytes(), scope1.as_bytes(), subject1].concat();
        let naive2 = [id2.as_bytes(), scope2.as_bytes(), subject2].concat();
        assert_eq!(naive1, naive2, "the pair must be ambiguous without length prefixes");
        let p1 = fixed(id1, scope1, 1, window);
        let p2 = fixed(id2, scope2, 1, window);
        assert_ne!(
            subject_key(&hasher, &p1, subject1),
            subject_key(&hasher, &p2, subject2),
            "{id1}/{scope1} vs {id2}/{scope2}"
        );
    }

    // Subjects can hold any byte, including a forged length prefix and "scope" bytes; the
    // result is still a different key from the genuine longer scope.
    let policy_b = fixed("a", "b", 1, window);
    let policy_bc = fixed("a", "bc", 1, window);
    let mut forged = Vec::new();
    push_field(&mut forged, b"c");
    assert_ne!(subject_key(&hasher, &policy_b, &forged), subject_key(&hasher, &policy_bc, b""));
}

fn identifier() -> impl Strategy<Value = String> {
    "[a-c0-1][a-c0-1._:-]{0,5}"
}

proptest! {
    /// For arbitrary valid identifiers and arbitrary subject bytes, `hash_for` equals the raw
    /// HMAC of the documented layout, and distinct (id, scope, subject) triples never share a
    /// key (the encoding is injective even where plain concatenation is not).
    #[test]
    fn hash_for_is_the_documented_layout(
        a in (identifier(), identifier(), proptest::collection::vec(any::<u8>(), 0..24)),
        b in (identifier(), identifier(), proptest::collection::vec(any::<u8>(), 0..24)),
    ) {
        let hasher = KeyHasher::new(&secret()).unwrap();
        let window = Duration::from_secs(1);
        let pa = FixedWindowPolicy::new(PolicyId::new(&a.0).unwrap(), ScopeId::new(&a.1).unwrap(), 1, window)
            .unwrap();
        let pb = FixedWindowPolicy::new(PolicyId::new(&b.0).unwrap(), ScopeId::new(&b.1).unwrap(), 1, window)
            .unwrap();
        let ka = subject_key(&hasher, &pa, &a.2);
        let kb = subject_key(&hasher, &pb, &b.2);
        prop_assert_eq!(ka, raw_hmac(&secret(), &subject_message(SUBJECT_TAG, &a.0, &a.1, &a.2)));
        prop_assert_eq!(ka == kb, a == b);
    }
}

// --- PolicyFingerprint ----------------------------------------------------------------------

#[test]
fn fingerprints_match_pinned_vectors() {
    let fixed_window = fixed("auth.login", "client", 40, Duration::from_secs(60));
    let gcra = GcraPolicy::new(
        PolicyId::new("api.read").unwrap(),
        ScopeId::new("client").unwrap(),
        10,
        Duration::from_secs(1),
        20,
    )
    .unwrap();
    let attempts = attempt("auth.password", "identity");
    let x = PolicyId::new("x").unwrap();
    let y = ScopeId::new("y").unwrap();

    let cases: [(&str, PolicyFingerprint, Vec<u8>); 5] = [
        (
            "e506cf4688abe555f396afc15e90519ba02f475947a6fd72dc261cc80aedebce",
            *fixed_window.fingerprint(),
            fingerprint_message("fixed-window", "auth.login", "client", &[40, 60_000]),
        ),
        (
            "b9712bd6b7da4470b3ac00d3ca772b9f4004c6de3007c2374c4afea85460e972",
            *gcra.fingerprint(),
            fingerprint_message("gcra", "api.read", "client", &[10, 1_000, 20]),
        ),
        (
            "8616b34fa46d92965f47f173fae3f7692c3808fc069ae449abfc80c3e0d33b7c",
            *attempts.fingerprint(),
            fingerprint_message("attempt", "auth.password", "identity", &[1_000, 300_000, 3_600_000, 30_000]),
        ),
        (
            "544b5e2d46955904868e8c73d042e81cfabdba0af840134075b96bfc5d6c9076",
            PolicyFingerprint::derive("custom-kind", &x, &y, &[]),
            fingerprint_message("custom-kind", "x", "y", &[]),
        ),
        (
            "cd971e111bc026a5139b558c3ec89a3c84d482cbf1830fe0f9286b4b31bc07d9",
            PolicyFingerprint::derive("custom-kind", &x, &y, &[0, u64::MAX]),
            fingerprint_message("custom-kind", "x", "y", &[0, u64::MAX]),
        ),
    ];
    for (pinned, derived, message) in cases {
        assert_eq!(hex_string(&sha256(&message)), pinned, "independent recomputation");
        assert_eq!(derived.to_string(), pinned, "Display is lowercase hex");
        assert_eq!(hex_string(derived.as_bytes()), pinned);
        assert_eq!(format!("{derived:?}"), format!("PolicyFingerprint({pinned})"));
    }

    // The kind constants are the documented strings.
    assert_eq!(FixedWindowPolicy::KIND, "fixed-window");
    assert_eq!(GcraPolicy::KIND, "gcra");
    assert_eq!(AttemptPolicy::KIND, "attempt");
}

#[test]
fn fingerprint_fields_are_length_prefixed() {
    let ab = PolicyId::new("ab").unwrap();
    let a = PolicyId::new("a").unwrap();
    let c = ScopeId::new("c").unwrap();
    let bc = ScopeId::new("bc").unwrap();
    assert_ne!(PolicyFingerprint::derive("k", &ab, &c, &[]), PolicyFingerprint::derive("k", &a, &bc, &[]));
    // Kind "k" + id "ab" vs kind "ka" + id "b".
    let b = PolicyId::new("b").unwrap();
    assert_ne!(PolicyFingerprint::derive("k", &ab, &c, &[]), PolicyFingerprint::derive("ka", &b, &c, &[]));
    // Parameters are fields of their own: [1] differs from no parameters and from [0, 1].
    let base = PolicyFingerprint::derive("k", &a, &c, &[1]);
    assert_ne!(base, PolicyFingerprint::derive("k", &a, &c, &[]));
    assert_ne!(base, PolicyFingerprint::derive("k", &a, &c, &[0, 1]));
    assert_ne!(base, PolicyFingerprint::derive("k", &a, &c, &[1, 0]));
}

#[test]
fn hasher_and_key_debug_are_redacted() {
    let hasher = KeyHasher::new(&secret()).unwrap();
    assert_eq!(format!("{hasher:?}"), "KeyHasher { .. }");
    let policy = fixed("auth.login", "identity", 8, Duration::from_secs(60));
    let subject = hasher.hash_for(&policy, b"user@example.test");
    assert_eq!(
        format!("{subject:?}"),
        r#"PolicySubject { policy: PolicyId("auth.login"), scope: ScopeId("identity"), .. }"#
    );
    let key = subject.into_unbound_subject_key();
    assert_eq!(format!("{key:?}"), "SubjectKey { .. }");
    let counter = runlimit_core::Check::new(key.bind(&policy)).counter_key();
    assert_eq!(
        format!("{counter:?}"),
        format!("CounterKey {{ fingerprint: PolicyFingerprint({}), .. }}", policy.fingerprint())
    );
}
