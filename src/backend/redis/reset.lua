-- Backend::reset: a key's states of every quota of its set, deleted in one
-- step (KEYS: the states, one hash tag). No state means a full quota, so
-- the key afterwards means what a key never seen means.
return redis.call('DEL', unpack(KEYS))
