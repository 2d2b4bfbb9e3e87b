"""`tuner screen` and `tuner reference record` (docs/screen.md): the portable reference's actions.

- `fleet.Screen`: every selected card screened at once against a reference bundle, one verdict each;
- `card.CardScreen`: one card's engine runs, fault attribution, error counters and verdict;
- `profile_setting.plan_profile_screen`: `--profile NAME` checked against every card as `tuner apply` checks it;
- `record.record_reference`: a card's stock trajectory, proven repeatable, bundled;
- `attribution`: the verdict rules (pure); `verdict`: the verdict's declared schema; `tolerance`: the held-out loss
  comparison (pure).
"""
