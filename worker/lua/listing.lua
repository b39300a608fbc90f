-- listing.lua: the order of matches (by distance, then incident ID in byte order) and listing the closest of
-- many: a sort of a few, a heap of many, and the merge of twin groups at one distance (search.lua's find_matches,
-- snapshot.lua's validation).

--- @include "base"

local function id_order()
  if 'B' < 'a' and '\195\169' > 'z' and 'a' < 'aa' then return nil end
  return bytes_less
end

local function plain_less(a, b) return a < b end

-- A claim's distances, as the worker writes them (the digits of 0 to 64), to their numbers by one look-up; anything
-- else (a number, digits written otherwise) as tonumber reads it. tonumber reads a string through strtod: about half
-- of a near storm claim's check of its 116 listed matches (benchmarks/journal/near-storms.md, section 15).
local DISTANCES = {}
for d = 0, 64 do DISTANCES['' .. d] = d end  -- (a library's top level has no tostring)
local function distance_number(s) return DISTANCES[s] or tonumber(s) end

-- The ID order of this FCALL (see id_order), a function in any case, found once for the calls of a batch.
local function id_less_of(context)
  local less = context.id_less
  if not less then
    less = id_order() or plain_less
    context.id_less = less
  end
  return less
end

-- Whether the match (ad, aid) comes before (bd, bid): by distance, then by ID in `less`'s order.
local function pair_before(less, ad, aid, bd, bid)
  if ad ~= bd then return ad < bd end
  return less(aid, bid)
end

-- Sort the first n of `list`, each {distance, ID}, by pair_before. Already in order (the claim's list, which the
-- worker sorted the same way, with nothing added) they are left as they are, after n - 1 comparisons: two pairs
-- neither of which comes first are the same pair, so any sort would give this order too.
local function sort_pairs(list, n, less)
  for i = 2, n do
    local a, b = list[i - 1], list[i]
    if pair_before(less, b[1], b[2], a[1], a[2]) then
      table.sort(list, function(x, y) return pair_before(less, x[1], x[2], y[1], y[2]) end)
      return
    end
  end
end

-- What a claim that listed `n_kept` matches no change touched takes of its window's `additions` (each {d, id}): every
-- one when the copy listed every match or was cut, else (`bounded`) only those not past its last listed match
-- (bound_d, bound_id: what the copy did not list lies past it, and a change past it may not be listed either), sorted;
-- then how many the alert lists (`want`, at most `cap` when cap > 0) and the count (a cut claim's at least that).
-- Returns adds, n_adds, want, count; nil when what it lists and takes does not cover `want`.
local function claim_takes(additions, n_additions, bounded, bound_d, bound_id, less, count, n_kept, cap, cut)
  local adds, n_adds = additions or {}, n_additions
  if bounded then
    adds, n_adds = {}, 0
    for i = 1, n_additions do
      local pair = additions[i]
      if not pair_before(less, bound_d, bound_id, pair[1], pair[2]) then
        n_adds = n_adds + 1
        adds[n_adds] = pair
      end
    end
  end
  if n_adds > 1 then sort_pairs(adds, n_adds, less) end
  local want = count
  if cut then
    want = n_kept + n_adds
    if count < want then count = want end
  end
  if cap > 0 and cap < want then want = cap end
  if n_kept + n_adds < want then return nil end
  return adds, n_adds, want, count
end

-- The first `need` of ids[1 .. count] in the order `less` (`order`: that order for table.sort, nil for Lua's own),
-- sorted: all of them sorted when they are few, else the first `need` kept in a heap as they are read (about one
-- comparison an ID past the first `need`, not a sort of thousands to list a hundred).
local function first_sorted(ids, count, need, less, order)
  if count <= need + 64 then
    table.sort(ids, order)
    return ids
  end
  -- a max-heap of the `need` first so far: heap[1] the last of them in the order
  local heap = {}
  for i = 1, need do
    local id, j = ids[i], i
    while j > 1 do
      local up = (j - j % 2) / 2
      if not less(heap[up], id) then break end
      heap[j] = heap[up]
      j = up
    end
    heap[j] = id
  end
  for i = need + 1, count do
    local id = ids[i]
    if less(id, heap[1]) then
      local j = 1
      while true do
        local child = 2 * j
        if child > need then break end
        if child < need and less(heap[child], heap[child + 1]) then child = child + 1 end
        if not less(id, heap[child]) then break end
        heap[j] = heap[child]
        j = child
      end
      heap[j] = id
    end
  end
  table.sort(heap, order)
  return heap
end

-- Members of a twin group read at first, while merging (a near storm's groups mostly hold 2), and most read at once.
local GROUP_FIRST_READ = 4

-- The first `need` IDs, in the order `less` (`order` for table.sort), of the incidents that the representatives
-- ids[1 .. count] at one distance stand for: each its twin group, when groups[i] is one's key (its members, read in
-- byte order), else itself (false). A merge: every group's first members and the lone representatives' first `need`
-- (first_sorted) are heads; the least head is taken `need` times, a group's next members read only when its head
-- is taken past what was read (in doubling reads, never past `need`). So the members read are at most about
-- GROUP_FIRST_READ a group plus twice `need`, whatever the groups' sizes (the first `need` of every group, read and
-- sorted, would be 300,000 IDs for 3,000 groups of 100 twins at one distance).
local function first_of_distance(ids, groups, count, need, less, order)
  local lone, n_lone = {}, 0
  local heads, n_heads = {}, 0  -- each {list, position, group key or false, members read of the group}
  local first_read = need < GROUP_FIRST_READ and need or GROUP_FIRST_READ
  for i = 1, count do
    local group = groups[i]
    if group then
      local members = redis.call('ZRANGE', group, 0, first_read - 1)
      if #members > 0 then
        n_heads = n_heads + 1
        heads[n_heads] = {members, 1, #members == first_read and group, #members}
      end
    else
      n_lone = n_lone + 1
      lone[n_lone] = ids[i]
    end
  end
  if n_lone > 0 then
    lone = first_sorted(lone, n_lone, need, less, order)
    if n_heads == 0 then return lone end
    n_heads = n_heads + 1
    heads[n_heads] = {lone, 1, false, 0}
  end
  -- a min-heap of the heads by their next ID
  local function head_less(a, b) return less(a[1][a[2]], b[1][b[2]]) end
  local function sift_down(j)
    local item = heads[j]
    while true do
      local child = 2 * j
      if child > n_heads then break end
      if child < n_heads and head_less(heads[child + 1], heads[child]) then child = child + 1 end
      if not head_less(heads[child], item) then break end
      heads[j] = heads[child]
      j = child
    end
    heads[j] = item
  end
  for j = (n_heads - n_heads % 2) / 2, 1, -1 do sift_down(j) end
  local out, taken = {}, 0
  while taken < need and n_heads > 0 do
    local head = heads[1]
    local list, position = head[1], head[2]
    taken = taken + 1
    out[taken] = list[position]
    position = position + 1
    if position > #list and head[3] and taken < need then
      -- the group has more than was read: its next members, as many again as read so far, within what is needed
      local more = head[4]
      if more > need - taken then more = need - taken end
      list = redis.call('ZRANGE', head[3], head[4], head[4] + more - 1)
      head[1], position = list, 1
      head[4] = head[4] + #list
      if #list < more then head[3] = false end
    end
    head[2] = position
    if position > #list then
      heads[1] = heads[n_heads]
      heads[n_heads] = nil
      n_heads = n_heads - 1
    end
    if n_heads > 0 then sift_down(1) end
  end
  return out
end
