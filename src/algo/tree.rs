//! Tree schedules: the double binary tree allreduce (in the spirit of NCCL
//! 2.4, after Sanders, Speck and Träff's two-tree algorithms), and
//! broadcast and reduce on one binary tree rooted at the caller's root.
//!
//! # The trees
//!
//! Number the positions of `n` ranks `1..=n`. In the *in-order bit tree*
//! the root is the largest power of two `<= n`; a position `x` whose lowest
//! set bit is `b` has the left child `x - b/2` and the right child `x + c`
//! for the largest `c` in `b/2, b/4, ..., 1` with `x + c <= n` (none if
//! there is none); odd positions (`b == 1`) are leaves. Every even position
//! has a left child, so the interior nodes are exactly the even positions,
//! and each step down halves the lowest set bit, so the depth is at most
//! `floor(log2 n)`.
//!
//! Tree 0 puts rank `x - 1` at position `x`; tree 1 is the same shape shifted
//! by one rank (rank `x mod n` at position `x`). A rank interior in tree 0
//! sits at an even position there and at an odd one in tree 1, so it is a
//! leaf of tree 1: no rank is interior in both trees, and each rank has at
//! most three neighbours per tree and four links in all that carry data in
//! both directions.
//!
//! # Allreduce
//!
//! The data is cut in two halves (`partition(count, 2, t)`); tree `t`
//! carries half `t`, cut in slices of at most `slice` elements. For each
//! slice a reduce runs up the tree and a broadcast down it:
//!
//! - up, non-root: a leaf sends its input; a rank with one child receives,
//!   adds its input and sends on (`RecvReduceSend`); a rank with two
//!   receives the first child into its output (`RecvReduceCopy`, local =
//!   input), then the second, adds the partial result and sends on
//!   (`RecvReduceSend`, local = output);
//! - root: `RecvReduceCopy` from its first child, then `RecvReduceCopySend`
//!   from the second (local = output) which starts the broadcast to the
//!   first child, then `Send` of the output to the second;
//! - down, non-root: `Recv` on a leaf, else `RecvCopySend` to the first
//!   child and `Send` (local = output) to the second.
//!
//! # Pipelining
//!
//! A rank at depth `d` of a tree of height `h` runs the up steps of slice
//! `s` at tick `s + h - d` and the down steps at tick `s + h + d`, so every
//! frame is received one tick after it is sent and the levels of both
//! trees work on consecutive slices at once. Within a tick, steps run by
//! priority: down steps by falling depth (`-d`), then up steps by rising
//! depth (`+d`), the root's (0) between. A frame's receiver then always has
//! priority one less than its sender, which keeps the schedule free of
//! deadlock over two-slot links (see `Timeline` (algo/mod.rs)) even on links
//! that both trees use.

use super::ring::RingParams;
use super::{
    partition, slice_of, token, Operand, Prim, Schedule, Step, Timeline, CONFIRM_TAG, NO_PEER,
};

/// One binary tree over the ranks of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryTree {
    /// The rank at the root.
    pub root: usize,
    /// Parent of each rank, [`NO_PEER`] for the root.
    pub parent: Vec<usize>,
    /// Children of each rank (at most two), left child first.
    pub children: Vec<Vec<usize>>,
    /// Depth of each rank (the root has depth 0).
    pub depth: Vec<usize>,
}

impl BinaryTree {
    /// The in-order bit tree over positions `1..=n` with rank
    /// `(x - 1 + shift) % n` at position `x`. Needs `n >= 1`.
    pub fn shifted(n: usize, shift: usize) -> BinaryTree {
        assert!(n >= 1, "a tree needs at least one rank");
        let rank_at = |x: usize| (x - 1 + shift) % n;
        let top = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let mut tree = BinaryTree {
            root: rank_at(top),
            parent: vec![NO_PEER; n],
            children: vec![Vec::new(); n],
            depth: vec![0; n],
        };
        // Walk down from the root; positions are visited parents first.
        let mut stack = vec![(top, 0usize)];
        while let Some((x, depth)) = stack.pop() {
            let rank = rank_at(x);
            tree.depth[rank] = depth;
            let b = x & x.wrapping_neg();
            let mut kids = Vec::new();
            if b > 1 {
                kids.push(x - b / 2);
                let mut c = b / 2;
                while c >= 1 && x + c > n {
                    c /= 2;
                }
                if c >= 1 {
                    kids.push(x + c);
                }
            }
            for &k in &kids {
                tree.parent[rank_at(k)] = rank;
                tree.children[rank].push(rank_at(k));
                stack.push((k, depth + 1));
            }
        }
        tree
    }

    /// The two trees of the double binary tree over `n` ranks.
    pub fn double(n: usize) -> [BinaryTree; 2] {
        [BinaryTree::shifted(n, 0), BinaryTree::shifted(n, 1)]
    }

    /// A bit tree over `n` ranks whose root is `root`.
    pub fn rooted_at(n: usize, root: usize) -> BinaryTree {
        let top = 1usize << (usize::BITS - 1 - n.leading_zeros());
        BinaryTree::shifted(n, (root + n - (top - 1) % n) % n)
    }

    /// Largest depth.
    pub fn height(&self) -> usize {
        self.depth.iter().copied().max().unwrap_or(0)
    }

    /// Whether `rank` has no children.
    pub fn is_leaf(&self, rank: usize) -> bool {
        self.children[rank].is_empty()
    }
}

/// Tag of a frame: unique per (slice, tree, phase) on every link.
fn tag(s: usize, tree: usize, phase: u32) -> u32 {
    (s as u32)
        .wrapping_mul(4)
        .wrapping_add(tree as u32 * 2)
        .wrapping_add(phase)
}

const UP: u32 = 0;
const DOWN: u32 = 1;

/// One rank's place in one tree, and the steps it emits there.
struct Node<'a> {
    tree: &'a BinaryTree,
    rank: usize,
    /// Which tree (tie-break stream and tag bit).
    index: usize,
}

impl Node<'_> {
    fn kids(&self) -> &[usize] {
        &self.tree.children[self.rank]
    }
    fn parent(&self) -> usize {
        self.tree.parent[self.rank]
    }
    fn depth(&self) -> usize {
        self.tree.depth[self.rank]
    }
    fn is_root(&self) -> bool {
        self.tree.root == self.rank
    }

    /// The up (reduce) steps of slice `s` at `(off, len)`. `down_too`: the
    /// root starts the broadcast (allreduce) instead of stopping (reduce).
    fn up(&self, s: usize, off: usize, len: usize, down_too: bool) -> Vec<Step> {
        let t = self.index;
        let step = |prim: Prim, local: Operand, from: usize, to: usize, send_tag: u32| Step {
            send_to: to,
            recv_from: from,
            send_tag,
            recv_tag: tag(s, t, UP),
            ..Step::local(prim, local, off, off, len)
        };
        let kids = self.kids();
        let (up, down) = (tag(s, t, UP), tag(s, t, DOWN));
        let mut out = Vec::new();
        if !self.is_root() {
            let p = self.parent();
            match *kids {
                [] => out.push(Step {
                    send_to: p,
                    send_tag: up,
                    ..Step::local(Prim::Send, Operand::Input, off, off, len)
                }),
                [a] => out.push(step(Prim::RecvReduceSend, Operand::Input, a, p, up)),
                [a, b] => {
                    out.push(step(Prim::RecvReduceCopy, Operand::Input, a, NO_PEER, 0));
                    out.push(step(Prim::RecvReduceSend, Operand::Output, b, p, up));
                }
                _ => unreachable!("binary tree"),
            }
        } else if !down_too {
            match *kids {
                [] => out.push(Step::local(Prim::Copy, Operand::Input, off, off, len)),
                [a] => out.push(step(Prim::RecvReduceCopy, Operand::Input, a, NO_PEER, 0)),
                [a, b] => {
                    out.push(step(Prim::RecvReduceCopy, Operand::Input, a, NO_PEER, 0));
                    out.push(step(Prim::RecvReduceCopy, Operand::Output, b, NO_PEER, 0));
                }
                _ => unreachable!("binary tree"),
            }
        } else {
            match *kids {
                [] => out.push(Step::local(Prim::Copy, Operand::Input, off, off, len)),
                [a] => out.push(step(Prim::RecvReduceCopySend, Operand::Input, a, a, down)),
                [a, b] => {
                    out.push(step(Prim::RecvReduceCopy, Operand::Input, a, NO_PEER, 0));
                    out.push(step(Prim::RecvReduceCopySend, Operand::Output, b, a, down));
                    out.push(Step {
                        send_to: b,
                        send_tag: down,
                        ..Step::local(Prim::Send, Operand::Output, off, off, len)
                    });
                }
                _ => unreachable!("binary tree"),
            }
        }
        out
    }

    /// The down (broadcast) steps of slice `s` on a non-root rank; `tag`
    /// names the frames of this phase.
    fn down(&self, off: usize, len: usize, tag: u32) -> Vec<Step> {
        let p = self.parent();
        let recv = |prim: Prim, to: usize| Step {
            recv_from: p,
            send_to: to,
            recv_tag: tag,
            send_tag: if to == NO_PEER { 0 } else { tag },
            ..Step::local(prim, Operand::Output, off, off, len)
        };
        match *self.kids() {
            [] => vec![recv(Prim::Recv, NO_PEER)],
            [a] => vec![recv(Prim::RecvCopySend, a)],
            [a, b] => vec![
                recv(Prim::RecvCopySend, a),
                Step {
                    send_to: b,
                    send_tag: tag,
                    ..Step::local(Prim::Send, Operand::Output, off, off, len)
                },
            ],
            _ => unreachable!("binary tree"),
        }
    }
}

fn slices(len: usize, slice: usize) -> usize {
    len.div_ceil(slice.max(1))
}

/// Allreduce of `count` elements on the double binary tree.
pub fn all_reduce(p: RingParams, count: usize) -> Schedule {
    let mut line = Timeline::default();
    for (index, tree) in BinaryTree::double(p.size).iter().enumerate() {
        let node = Node {
            tree,
            rank: p.rank,
            index,
        };
        let (h, d) = (tree.height() as u64, node.depth() as u64);
        let half = partition(count, 2, index);
        for s in 0..slices(half.1, p.slice) {
            let (off, len) = slice_of(half, s, p.slice);
            let s64 = s as u64;
            for step in node.up(s, off, len, true) {
                line.at(s64 + h - d, d as i64, index, step);
            }
            if !node.is_root() {
                for step in node.down(off, len, tag(s, index, DOWN)) {
                    line.at(s64 + h + d, -(d as i64), index, step);
                }
            }
        }
    }
    line.into_schedule()
}

/// Broadcast of `count` elements from `root` down one binary tree; the
/// buffer is both input and output.
pub fn broadcast(p: RingParams, count: usize, root: usize) -> Schedule {
    let tree = BinaryTree::rooted_at(p.size, root);
    let node = Node {
        tree: &tree,
        rank: p.rank,
        index: 0,
    };
    let d = node.depth() as u64;
    let mut line = Timeline::default();
    for s in 0..slices(count, p.slice) {
        let (off, len) = slice_of((0, count), s, p.slice);
        let steps = if node.is_root() {
            node.kids()
                .iter()
                .map(|&k| Step {
                    send_to: k,
                    send_tag: s as u32,
                    ..Step::local(Prim::Send, Operand::Input, off, off, len)
                })
                .collect()
        } else {
            node.down(off, len, s as u32)
        };
        for step in steps {
            line.at(s as u64 + d, -(d as i64), 0, step);
        }
    }
    line.into_schedule()
}

/// A confirmation after a broadcast's or reduce's data steps on the binary
/// tree rooted at `root`: with `up`, empty frames first go up from the
/// leaves (each rank passes one on once it has its children's, so the root
/// learns that every rank ran its call; a reduce's data did that already),
/// then down from the root, so that every rank learns it.
pub fn confirmation(p: RingParams, root: usize, up: bool) -> Schedule {
    let tree = BinaryTree::rooted_at(p.size, root);
    let (parent, kids) = (tree.parent[p.rank], &tree.children[p.rank]);
    let mut out = Schedule::default();
    let (up_tag, down_tag) = (CONFIRM_TAG, CONFIRM_TAG + 1);
    if up {
        for &k in kids {
            out.push(token(Prim::Recv, k, up_tag));
        }
        if parent != NO_PEER {
            out.push(token(Prim::Send, parent, up_tag));
        }
    }
    if parent != NO_PEER {
        out.push(token(Prim::Recv, parent, down_tag));
    }
    for &k in kids {
        out.push(token(Prim::Send, k, down_tag));
    }
    out
}

/// Reduce of `count` elements up one binary tree to `root`, whose output
/// gets the result. A non-root rank with two children keeps a partial
/// result in its output, so the caller must give it one (see
/// `coll::reduce`).
pub fn reduce(p: RingParams, count: usize, root: usize) -> Schedule {
    let tree = BinaryTree::rooted_at(p.size, root);
    let node = Node {
        tree: &tree,
        rank: p.rank,
        index: 0,
    };
    let (h, d) = (tree.height() as u64, node.depth() as u64);
    let mut line = Timeline::default();
    for s in 0..slices(count, p.slice) {
        let (off, len) = slice_of((0, count), s, p.slice);
        for step in node.up(s, off, len, false) {
            line.at(s as u64 + h - d, d as i64, 0, step);
        }
    }
    line.into_schedule()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tree(t: &BinaryTree, n: usize) {
        assert_eq!(t.parent.len(), n);
        assert_eq!(t.parent[t.root], NO_PEER);
        assert_eq!(t.depth[t.root], 0);
        let mut seen = vec![0usize; n];
        seen[t.root] += 1;
        for r in 0..n {
            assert!(t.children[r].len() <= 2, "n={n} rank {r} has >2 children");
            for &c in &t.children[r] {
                seen[c] += 1;
                assert_eq!(
                    t.parent[c], r,
                    "n={n}: child {c} of {r} names another parent"
                );
                assert_eq!(t.depth[c], t.depth[r] + 1);
            }
            if r != t.root {
                let p = t.parent[r];
                assert!(p < n, "n={n}: rank {r} has no parent");
                assert!(t.children[p].contains(&r));
            }
        }
        assert!(
            seen.iter().all(|&k| k == 1),
            "n={n}: ranks not once: {seen:?}"
        );
        // Depth is floor(log2 n): log-depth latency.
        let log = (usize::BITS - 1 - n.leading_zeros()) as usize;
        assert!(t.height() <= log, "n={n}: height {} > {log}", t.height());
    }

    #[test]
    fn trees_hold_every_rank_once_with_log_depth() {
        for n in 1..=64 {
            for t in BinaryTree::double(n) {
                check_tree(&t, n);
            }
            for root in 0..n {
                let t = BinaryTree::rooted_at(n, root);
                check_tree(&t, n);
                assert_eq!(t.root, root);
            }
        }
    }

    #[test]
    fn no_rank_is_interior_in_both_trees() {
        for n in 1..=64 {
            let [a, b] = BinaryTree::double(n);
            for r in 0..n {
                assert!(
                    a.is_leaf(r) || b.is_leaf(r),
                    "n={n}: rank {r} is interior in both trees"
                );
            }
            // Interior nodes are the even positions: n/2 per tree.
            let interior = |t: &BinaryTree| (0..n).filter(|&r| !t.is_leaf(r)).count();
            assert_eq!(interior(&a), n / 2);
            assert_eq!(interior(&b), n / 2);
        }
    }

    #[test]
    fn small_trees_look_as_documented() {
        // n = 6: positions 4 (root), 2 (1, 3), 6 (5).
        let [a, b] = BinaryTree::double(6);
        assert_eq!(a.root, 3);
        assert_eq!(a.children[3], vec![1, 5]);
        assert_eq!(a.children[1], vec![0, 2]);
        assert_eq!(a.children[5], vec![4]);
        assert_eq!(b.root, 4);
        assert_eq!(b.children[4], vec![2, 0]);
        assert_eq!(b.children[2], vec![1, 3]);
        assert_eq!(b.children[0], vec![5]);
        // n = 2: each rank is the root of one tree.
        let [a, b] = BinaryTree::double(2);
        assert_eq!((a.root, b.root), (1, 0));
    }
}
