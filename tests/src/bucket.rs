//! A prefix of its own in the test bucket (`EVERVM_TEST_S3`, on the S3-compatible server that
//! `scripts/test.sh` starts and names in the standard `AWS_*` environment).

/// `s3://BUCKET/test-RANDOM`, or `None` (with a note) when no test bucket is configured outside
/// CI.
pub fn scratch_bucket() -> Option<String> {
    let Ok(url) = std::env::var("EVERVM_TEST_S3") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the bucket tests: set EVERVM_TEST_S3 (scripts/test.sh starts an \
             S3-compatible server)"
        );
        eprintln!("skipping: EVERVM_TEST_S3 is not set (scripts/test.sh sets it)");
        return None;
    };
    Some(format!(
        "{}/test-{:016x}",
        url.trim_end_matches('/'),
        rand::random::<u64>()
    ))
}
