//! The audit log's part of the store suite ([`super::suite`]): the same checks on both
//! databases.

use chrono::{Duration, Utc};

use super::{AuditEntry, AuditQuery, Metadata};

fn entry(account: &str, action: &str, machine: Option<&str>) -> AuditEntry {
    AuditEntry {
        account: Some(account.to_owned()),
        token_id: Some(format!("{account}-token")),
        machine: machine.map(str::to_owned),
        node: Some("node-1".to_owned()),
        detail: Some("sha256:00".to_owned()),
        ..AuditEntry::now("api", action, "ok")
    }
}

fn page(limit: usize) -> AuditQuery {
    AuditQuery {
        limit,
        ..AuditQuery::default()
    }
}

pub(super) async fn audit(store: &dyn Metadata) {
    assert!(store.audit_entries(&page(10)).await.unwrap().is_empty());
    let mut old = entry("alice", "machine.create", Some("m-1"));
    old.at = Utc::now() - Duration::days(40);
    store
        .record_audit(vec![
            old.clone(),
            entry("alice", "exec", Some("m-1")),
            entry("bob", "exec", Some("m-2")),
            AuditEntry {
                outcome: "404 Not Found".into(),
                ..entry("bob", "machine.delete", Some("m-9"))
            },
            AuditEntry::now("cli", "token.create", "ok"),
        ])
        .await
        .unwrap();
    let all = store.audit_entries(&page(100)).await.unwrap();
    assert_eq!(all.len(), 5);
    // Newest first, every column read back as written.
    assert!(all.windows(2).all(|w| w[0].id > w[1].id), "{all:?}");
    let oldest = all.last().unwrap();
    assert_eq!(
        AuditEntry {
            id: 0,
            at: old.at,
            ..oldest.clone()
        },
        old
    );
    assert_eq!(
        all[0].account, None,
        "the operator's entry names no account"
    );

    let alice = AuditQuery {
        account: Some("alice".into()),
        ..page(100)
    };
    let alices = store.audit_entries(&alice).await.unwrap();
    assert_eq!(alices.len(), 2);
    assert!(alices.iter().all(|e| e.account.as_deref() == Some("alice")));
    let execs = AuditQuery {
        action: Some("exec".into()),
        machine: Some("m-2".into()),
        ..page(100)
    };
    assert_eq!(store.audit_entries(&execs).await.unwrap().len(), 1);
    let recent = AuditQuery {
        since: Some(Utc::now() - Duration::days(1)),
        ..page(100)
    };
    assert_eq!(store.audit_entries(&recent).await.unwrap().len(), 4);
    // Paging backwards by id.
    let first = store.audit_entries(&page(2)).await.unwrap();
    let next = AuditQuery {
        before_id: Some(first[1].id),
        ..page(2)
    };
    let second = store.audit_entries(&next).await.unwrap();
    assert_eq!(second.len(), 2);
    assert!(second[0].id < first[1].id);

    // Pruning: by age, then by count (the newest kept).
    let removed = store
        .prune_audit(Utc::now() - Duration::days(30), u64::MAX)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert!(
        store
            .audit_entries(&page(100))
            .await
            .unwrap()
            .iter()
            .all(|e| e.action != "machine.create")
    );
    let removed = store
        .prune_audit(Utc::now() - Duration::days(30), 2)
        .await
        .unwrap();
    assert_eq!(removed, 2);
    let left = store.audit_entries(&page(100)).await.unwrap();
    assert_eq!(left, all[..2].to_vec());
    // Nothing left to remove.
    assert_eq!(
        store
            .prune_audit(Utc::now() - Duration::days(30), 2)
            .await
            .unwrap(),
        0
    );
}
