-- SPDX-License-Identifier: BSD-3-Clause
-- job_submit.lua — mall's part of slurmctld's job_submit/lua plugin: it merges a node's figures
-- into a job's AdminComment inside slurmctld, so that malld (`--slurm-comment-merge slurmctld`)
-- records a job's figures with one RPC per node, without reading the field first and without a
-- race between the nodes of a multi-node job (slurmctld calls slurm_job_modify under its job
-- write lock, so each merge sees the previous one).
--
-- Contract: only an update whose AdminComment starts with "mall-merge;" is touched. Its rest is
-- one segment "mall:<node>:<figures>" (figures without ';'); the job's AdminComment becomes its
-- current ';'-separated parts without that node's older segment, then the new segment: the other
-- nodes' segments and any text of the site's are kept. A malformed request is refused and changes
-- nothing. slurmctld lets only root, SlurmUser and operators set AdminComment, and checks that
-- before it calls slurm_job_modify; submissions are not touched.
--
-- Install: as job_submit.lua beside slurm.conf, with JobSubmitPlugins=lua, then restart slurmctld.
-- A site with its own job_submit.lua copies mall_merge_admin_comment into it instead, and calls it
-- first in its slurm_job_modify (returning its result when it is not slurm.SUCCESS).

local merge_mark = "mall-merge;"

function mall_merge_admin_comment(job_desc, job_rec)
  local request = job_desc.admin_comment
  if request == nil or string.sub(request, 1, #merge_mark) ~= merge_mark then
    return slurm.SUCCESS
  end
  local segment = string.sub(request, #merge_mark + 1)
  local node = string.match(segment, "^mall:([^:;]+):[^;]*$")
  if node == nil then
    slurm.log_user("mall: an AdminComment merge request must be 'mall-merge;mall:<node>:<figures>' " ..
                   "without ';' in the figures")
    return slurm.ERROR
  end
  local mine = "mall:" .. node .. ":"
  local parts = {}
  for part in string.gmatch(job_rec.admin_comment or "", "[^;]+") do
    if string.sub(part, 1, #mine) ~= mine then table.insert(parts, part) end
  end
  table.insert(parts, segment)
  job_desc.admin_comment = table.concat(parts, ";")
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return mall_merge_admin_comment(job_desc, job_rec)
end
