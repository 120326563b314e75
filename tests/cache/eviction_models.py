"""Plain-Python models of every eviction policy (lists and linear scans), and a policy that checks a
real one against its model on every call.

Each model keeps its own state (it never reads ``policy_state``): the order a
policy would evict in is found by popping from a copy of the model.
"""

import copy

from jaxpaged.cache.eviction import EvictionPolicy, make_policy


class LRUModel:
    """Evict the block freed longest ago."""

    def __init__(self, num_blocks):
        self.order = []

    def add(self, block):
        self.order.append(block)

    def remove(self, block):
        self.order.remove(block)

    def pop(self):
        return self.order.pop(0)


class LFUModel:
    """Evict the block with the fewest hits when freed; ties: freed longest ago."""

    def __init__(self, num_blocks):
        self.entries = []  # (hits when freed, arrival number, block)
        self.arrivals = 0

    def add(self, block):
        self.arrivals += 1
        self.entries.append((block.hits, self.arrivals, block))

    def remove(self, block):
        self.entries = [e for e in self.entries if e[2] is not block]

    def pop(self):
        best = min(self.entries, key=lambda e: (e[0], e[1]))
        self.entries.remove(best)
        return best[2]


class SieveModel:
    """A FIFO list (oldest first), a hand index, and the hit count each block had when the hand last
    passed it (visited = hit since)."""

    def __init__(self, num_blocks):
        self.queue = []
        self.hand = 0
        self.seen = {}  # block id -> hits when the hand last cleared it

    def _visited(self, block):
        return block.hits > self.seen.get(block.block_id, 0)

    def add(self, block):
        self.queue.append(block)

    def remove(self, block):
        index = self.queue.index(block)
        del self.queue[index]
        if index < self.hand:
            self.hand -= 1
        if self.hand >= len(self.queue):
            self.hand = 0

    def pop(self):
        i = self.hand % len(self.queue)
        while self._visited(self.queue[i]):
            self.seen[self.queue[i].block_id] = self.queue[i].hits
            i = (i + 1) % len(self.queue)
        victim = self.queue.pop(i)
        self.seen.pop(victim.block_id, None)  # its next life starts at 0 hits
        self.hand = i if i < len(self.queue) else 0
        return victim


class SLRUModel:
    """Probation and protected lists; never-hit blocks start on probation; protected holds at most
    80% of the pool, its oldest demoted past that."""

    def __init__(self, num_blocks):
        self.probation, self.protected = [], []
        self.cap = max(1, int(0.8 * num_blocks))

    def add(self, block):
        if block.hits == 0:
            self.probation.append(block)
            return
        self.protected.append(block)
        if len(self.protected) > self.cap:
            self.probation.append(self.protected.pop(0))

    def remove(self, block):
        (self.probation if block in self.probation else self.protected).remove(block)

    def pop(self):
        return (self.probation or self.protected).pop(0)


MODELS = {"lru": LRUModel, "lfu": LFUModel, "sieve": SieveModel, "slru": SLRUModel}


class CheckedPolicy(EvictionPolicy):
    """Forwards every call to the real policy and to its model; each pop and each eviction order must
    agree, and a pinned hash (``pinned(hash)`` true) must never reach the policy."""

    def __init__(self, name, num_blocks, pinned=lambda block_hash: False):
        super().__init__(num_blocks)
        self.name, self.cost = name, "checked"
        self.real = make_policy(name, num_blocks)
        self.model = MODELS[name](num_blocks)
        self.pinned = pinned
        self.size = 0

    def __len__(self):
        assert len(self.real) == self.size
        return self.size

    def add(self, block):
        assert block.ref_count == 0 and block.block_hash is not None
        assert not self.pinned(block.block_hash), f"pinned block {block.block_id} given to the policy"
        self.real.add(block)
        self.model.add(block)
        self.size += 1

    def remove(self, block):
        self.real.remove(block)
        self.model.remove(block)
        self.size -= 1

    def pop(self):
        got, want = self.real.pop(), self.model.pop()
        assert got is want, f"{self.name} evicted block {got.block_id}, its model block {want.block_id}"
        self.size -= 1
        return got

    def model_order(self):
        """What the model would evict, in order, if nothing else happened."""
        model = copy.copy(self.model)
        for name, value in vars(self.model).items():  # copy the containers, share the blocks
            setattr(model, name, copy.copy(value))
        return [model.pop() for _ in range(self.size)]

    def __iter__(self):
        order = list(self.real)
        assert order == self.model_order(), f"{self.name}: eviction order differs from the model's"
        return iter(order)

    def check(self):
        self.real.check()
        list(self)
