//! The table's index, bound, sweep and eviction.

use super::*;

struct Until(u64);

impl Expiring for Until {
    fn expires_at(&self) -> u64 {
        self.0
    }
}

#[test]
fn keys_compare_equal_exactly_when_their_bytes_do() {
    let base: Vec<u8> = (0..40u8).map(|b| b'a' + b % 26).collect();
    for len in 0..=40 {
        let a = &base[..len];
        assert!(same_key(a, a), "{len}");
        if len > 0 {
            assert!(!same_key(a, &base[..len - 1]), "{len}");
        }
        for at in 0..len {
            let mut b = a.to_vec();
            b[at] ^= 1;
            assert!(!same_key(a, &b), "length {len}, byte {at}");
        }
    }
}

#[test]
fn entries_are_found_updated_and_removed() {
    let table: Table<Until> = Table::new(100, 4);
    let mut shard = table.lock("k");
    shard.insert(1, "k", Until(10), 0);
    shard.insert(2, "k", Until(20), 0);
    assert_eq!(shard.get(1, "k").map(|v| v.0), Some(10));
    if let Some(v) = shard.get_mut(2, "k") {
        v.0 = 30;
    }
    assert_eq!(shard.get(2, "k").map(|v| v.0), Some(30));
    shard.remove(1, "k");
    assert!(shard.get(1, "k").is_none());
    assert_eq!(
        shard.get(2, "k").map(|v| v.0),
        Some(30),
        "the moved entry is found"
    );
    drop(shard);
    assert_eq!(table.len(), 1);
}

/// The value at `(id, key)`, and whether it is a word.
fn value(table: &Table<Until>, id: u64, key: &str) -> Option<(u64, bool)> {
    let shard = table.lock(key);
    match shard.at(shard.position(id, key)?)? {
        Found::Wide(v) => Some((v.0, false)),
        Found::Word(v) | Found::Pair(v) => Some((v.0, true)),
    }
}

#[test]
fn wide_and_word_entries_share_the_index_the_bound_and_the_sweep() {
    let table: Table<Until> = Table::new(1_000, 1);
    for i in 0..300u64 {
        let key = i.to_string();
        let mut shard = table.lock(&key);
        shard.insert(1, &key, Until(1_000 + i), 0);
        shard.insert_word(2, &key, Until(2_000 + i), 0);
    }
    assert_eq!(table.len(), 600);
    assert_eq!(table.read("7").word(2, "7").map(|v| v.0), Some(2_007));
    assert!(table.read("7").word(1, "7").is_none(), "a wide entry");
    // Removals move the last entry of each vector into the gap.
    for i in (0..300u64).step_by(3) {
        let key = i.to_string();
        assert_eq!(table.lock(&key).remove(1, &key), -1);
        assert_eq!(table.lock(&key).remove(2, &key), -1);
        assert_eq!(table.lock(&key).remove(2, &key), 0);
    }
    for i in 0..300u64 {
        let key = i.to_string();
        let kept = i % 3 != 0;
        assert_eq!(value(&table, 1, &key), kept.then_some((1_000 + i, false)));
        assert_eq!(value(&table, 2, &key), kept.then_some((2_000 + i, true)));
    }
    // Both kinds count toward the bound, and both are evicted.
    let table: Table<Until> = Table::new(64, 1);
    for i in 0..1_000u64 {
        let key = i.to_string();
        let mut shard = table.lock(&key);
        if i % 2 == 0 {
            shard.insert(1, &key, Until(u64::MAX), 0);
        } else {
            shard.insert_word(1, &key, Until(u64::MAX), 0);
        }
    }
    assert_eq!(table.len(), 64);
    // Both kinds are swept once expired.
    let table: Table<Until> = Table::new(64, 1);
    for i in 0..10u64 {
        let key = i.to_string();
        table.lock(&key).insert(1, &key, Until(5), 0);
        table.lock(&key).insert_word(2, &key, Until(5), 0);
    }
    table
        .lock("late")
        .insert_word(2, "late", Until(u64::MAX), PURGE_EVERY);
    assert_eq!(table.len(), 1);
    assert_eq!(value(&table, 2, "late"), Some((u64::MAX, true)));
}

#[test]
fn the_bound_holds_and_expired_entries_are_swept() {
    let table: Table<Until> = Table::new(64, 1);
    for i in 0..1_000u64 {
        table
            .lock(&i.to_string())
            .insert(1, &i.to_string(), Until(u64::MAX), 0);
    }
    assert_eq!(table.len(), 64);
    assert_eq!(table.capacity(), 64);
    for (max, shards) in [(10, 64), (1_000, 64), (1, 8), (5_003, 64)] {
        let table: Table<Until> = Table::new(max, shards);
        for i in 0..20 * max as u64 + 200 {
            table
                .lock(&i.to_string())
                .insert(1, &i.to_string(), Until(u64::MAX), 0);
        }
        assert_eq!(table.len(), max, "the bound is exact");
    }
    let table: Table<Until> = Table::new(64, 1);
    for i in 0..10u64 {
        table
            .lock(&i.to_string())
            .insert(1, &i.to_string(), Until(5), 0);
    }
    table
        .lock("late")
        .insert(1, "late", Until(u64::MAX), PURGE_EVERY);
    assert_eq!(table.len(), 1, "expired entries are swept on insert");
}

#[test]
fn a_flood_under_one_id_does_not_evict_another_ids_entries() {
    let table: Table<Until> = Table::new(100, 1);
    // Another rule's 10 entries, expiring soonest of all.
    for i in 0..10u64 {
        let key = format!("login:{i}");
        table.lock(&key).insert(7, &key, Until(1_000), 0);
    }
    for i in 0..10_000u64 {
        let key = format!("flood:{i}");
        table.lock(&key).insert(9, &key, Until(u64::MAX), 1);
    }
    for i in 0..10u64 {
        let key = format!("login:{i}");
        assert!(table.lock(&key).get(7, &key).is_some(), "{key} was evicted");
    }
    assert_eq!(table.len(), 100);
}

#[test]
fn within_an_id_the_entry_closest_to_expiry_is_evicted() {
    let table: Table<Until> = Table::new(16, 1);
    for i in 0..16u64 {
        let key = i.to_string();
        table.lock(&key).insert(1, &key, Until(100 + i), 0);
    }
    table.lock("new").insert(1, "new", Until(1_000), 1);
    assert!(
        table.lock("0").get(1, "0").is_none(),
        "the soonest to expire went"
    );
    assert!(table.lock("15").get(1, "15").is_some());
}

/// Thousands of keys under one id in one shard: some share the part of
/// their hash the index compares first, so the search by id alone meets
/// another key's entry and searches again in full; every key still finds
/// its own word and its own pair, and a key never stored finds nothing.
#[test]
fn keys_of_one_id_whose_hashes_collide_find_their_own_entries() {
    let table: Table<Until> = Table::new(10_000, 1);
    for i in 0..4_000u64 {
        let key = format!("k{i}");
        let mut shard = table.lock(&key);
        shard.insert_word(1, &key, Until(i), 0);
        shard.insert_pair(2, &key, Until(10_000 + i), 0);
    }
    for i in 0..4_000u64 {
        let key = format!("k{i}");
        let read = table.read(&key);
        assert_eq!(read.word(1, &key).map(|v| v.0), Some(i), "{key}");
        assert_eq!(read.pair(2, &key).map(|v| v.0), Some(10_000 + i), "{key}");
        assert!(read.pair(1, &key).is_none() && read.word(2, &key).is_none());
    }
    for i in 4_000..8_000u64 {
        let key = format!("k{i}");
        let read = table.read(&key);
        assert!(read.word(1, &key).is_none() && read.pair(2, &key).is_none());
    }
}
