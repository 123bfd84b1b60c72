//! Checkpoints: copies of the upper layer to return to and compare.

use std::path::PathBuf;

use hako_layers::{Layers, Status};

use crate::{opaque, put, whiteout, Fixture};

fn statuses(changes: &[hako_layers::Change]) -> Vec<(PathBuf, Status)> {
    changes
        .iter()
        .map(|c| (c.path.clone(), c.status()))
        .collect()
}

#[test]
fn a_checkpoint_keeps_the_layer_as_it_was_and_a_rollback_returns_to_it() {
    let f = Fixture::new(|ws| {
        put(&ws.join("a"), "a\n");
        put(&ws.join("gone"), "bye\n");
        put(&ws.join("o/old"), "old\n");
    });
    let up = f.upper();
    put(&up.join("a"), "a1\n");
    whiteout(&up.join("gone"));
    put(&up.join("o/new"), "new\n");
    opaque(&up.join("o"));
    std::os::unix::fs::symlink("a", up.join("link")).unwrap();
    let at_one = f.changes();
    let one = f.state().checkpoint(Some("turn-1")).unwrap();
    assert_eq!((one.id, one.label.as_deref()), (1, Some("turn-1")));
    // The checkpoint's copy reads as the layer did.
    let (_, saved) = f.state().checkpoint_upper("turn-1").unwrap();
    assert_eq!(
        Layers::open(f.ws(), &saved).unwrap().changes().unwrap(),
        at_one
    );
    // The agent goes on.
    put(&up.join("a"), "a2\n");
    put(&up.join("b"), "b\n");
    let two = f.state().checkpoint(None).unwrap();
    assert_eq!(two.id, 2);
    // Comparing the two: only what changed between them.
    let (_, one_upper) = f.state().checkpoint_upper("1").unwrap();
    let (_, two_upper) = f.state().checkpoint_upper("2").unwrap();
    let layers = Layers::open_between(f.ws(), &one_upper, &two_upper).unwrap();
    let between = layers.changes_between().unwrap();
    assert_eq!(
        statuses(&between),
        [
            (PathBuf::from("a"), Status::Modified),
            (PathBuf::from("b"), Status::Added)
        ]
    );
    let text = hako_layers::render::unified(&layers, &between);
    assert!(text.contains("-a1\n+a2\n"), "{text}");
    // Back to the first.
    f.state().rollback("turn-1").unwrap();
    assert_eq!(f.changes(), at_one);
    assert_eq!(f.state().checkpoints().unwrap().len(), 2);
    assert!(f.state().rollback("nope").is_err());
}
