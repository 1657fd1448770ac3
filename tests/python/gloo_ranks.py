"""What the gloo CPU tests of exactjit's distributed paths share: ranks spawned as processes that
write their problems to a folder, and the problems collected."""
import os
import tempfile

import torch.multiprocessing as mp


def write_problems(folder, rank, problems):
    """A rank's problems, if any, go to folder/rank<r>.txt."""
    if problems:
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as f:
            f.write("; ".join(problems))


def problems_of_ranks(rank_main, world, *args):
    """Runs rank_main(rank, world, *args, folder) on `world` processes: {"rank<r>": problems} of
    the ranks that wrote any."""
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(rank_main, args=(world, *args, folder), nprocs=world)
        found = {}
        for name in sorted(os.listdir(folder)):
            if name.startswith("rank"):
                with open(os.path.join(folder, name)) as f:
                    found[name[:-4]] = f.read()
        return found
