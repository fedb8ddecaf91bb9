"""Pieces shared by the apps (``data``, ``doctor``, ``bench``, ``train``, ``serve``), kept below them
so that no app imports another: prompt sets, torchrun's process group, the shipped-draft registry,
what a draft's training recorded, a target's facts and a server's acceptance metrics."""
