#!/usr/bin/env bash
# Session 27's candidate on main 9f4aa6c: the whole-tiers patch of session 26 (the channels-last
# tiers without the split exchange's code) plus the NCDHW L2-streamed split forward leaving the
# exchange late (merge_chunk_stats returns the departure's ticket; exchange_leave_end after the
# output pass, as the other splits since session 26), and exchange_leave_end's block folded away
# where the ticket is the constant kNoTicket. A/B of the deep tiers and of the streamed split
# (1,16,256^3 both layouts), then the whole suite. From the branch, .baseline = main:
#   OUT=... bash bench/results/2026-12-06-session27/whole_tiers_late_fwd.sh     (give it >= 500 s)
OUT=${OUT:-./whole_tiers_late_fwd_out} bench/ab_then_suite.sh .baseline --layouts ndhwc,ncdhw --modes fwd,bwd \
  --dtypes fp16,bf16 --shapes 2,320,4,4,4 2,320,8,8,8 1,16,256,256,256
