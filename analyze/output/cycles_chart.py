"""Every cycle on one chart: the report's interactive view of ``res.steady.cycles`` (inline SVG and JavaScript).

Each cycle's period, per rank (one marker shape per rank), coloured by its class: typical, a class of slower
cycles that recurs, a rare stall, or left out (warm-up, outside a chosen window); the batch-size segments are
bands behind them. Hovering a cycle shows its cycle-budget pieces per rank (between cycles, each phase with its
compute / comm / idle, each seam: :func:`analyze.compute.cycle_budget.cycle_pieces`, which add up to its period) and
the classes and findings that name it; clicking one pins it and draws it across ranks as a Gantt on the GPU clock
(each rank's pieces end at its cycle's last GPU op). The findings table links to its cycles here
(``#cycles`` with ``data-finding``) and to the annotated timeline file.

The data is one JSON object in ``<script type="application/json" id="spectrace-cycles">`` (:func:`data`): the
cycles as columns, row for row with ``res.steady.cycles`` of the cycle kind; the pieces; the classes, segments and
findings with the cycles they name. Nothing is fetched: no network, no CDN. Pieces are embedded for at most
:data:`MAX_PIECES` rows (a long run's later cycles then show their period and class only, and the chart says so).
"""

from __future__ import annotations

import html
import json
from typing import Any

import polars as pl

from nvtx_hooks.phases import COMM_COLOR, COMPUTE_COLOR, IDLE_COLOR, SEAM_COLOR, color_of

from ..compute import cycle_budget
from ..model import Result
from .timeline import class_cycles, finding_cycles

__all__ = ["MAX_PIECES", "TYPICAL_COLOR", "CLASS_COLORS", "STALL_COLOR", "LEFT_OUT_COLOR", "CSS", "data",
           "section_html"]

MAX_PIECES = 200_000  # pieces embedded (about 6 MB of page); past it, the chart says which cycles have none
# Okabe–Ito, colour-blind safe: typical cycles, classes that recur (in order), rare stalls, left out
TYPICAL_COLOR = "#0072B2"
CLASS_COLORS = ("#E69F00", "#CC79A7", "#009E73", "#56B4E9", "#F0E442", "#000000")
STALL_COLOR = "#D55E00"
LEFT_OUT_COLOR = "#999999"
_CYCLE_COLS = ("rank", "key", "n", "period_ns", "i_last", "cycle_class", "segment", "slow", "steady", "why",
               "batch_size", "tokens")



def data(res: Result, found: list | None = None, timeline_file: str | None = None) -> dict[str, Any]:
    """What the chart shows, as one JSON-ready object (module docstring): ``cycles`` (columns of
    ``res.steady.cycles``), ``pieces`` (columns, ``item``/``kind`` as indices into ``items``/``kinds``),
    ``classes``, ``segments``, ``findings`` (each with the cycles it names), ``ranks``, ``colors``."""

    found = res.steady.findings if found is None else found
    c = cycle_budget.kind_cycles(res)
    cols = {k: c[k].to_list() if k in c.columns else [None] * c.height for k in _CYCLE_COLS}
    p = cycle_budget.cycle_pieces(res)
    cut = None
    if p.height > MAX_PIECES:
        keep = p.select("key").unique().sort("key").with_columns(_n=pl.int_range(pl.len()))
        per = max(p.height // max(keep.height, 1), 1)
        last = int(keep.filter(pl.col("_n") < MAX_PIECES // per)["key"].max())  # type: ignore[arg-type]
        p = p.filter(pl.col("key") <= last)
        cut = f"pieces embedded for cycles up to {last} (of {c['key'].max()!r}): more would make the page too big"
    p = p.sort("rank", "key", "order")
    items = p["item"].cast(pl.String).unique(maintain_order=True).to_list()
    kinds = ["gap", "prefill", "head", "phase", "seam", "tail"]
    pieces = {
        "rank": p["rank"].to_list(), "key": p["key"].to_list(),
        "item": p["item"].cast(pl.String).replace_strict(items, list(range(len(items))), return_dtype=pl.Int64).to_list(),
        "kind": p["kind"].cast(pl.String).replace_strict(kinds, list(range(len(kinds))), return_dtype=pl.Int64).to_list(),
        **{k: [None if v is None else round(v) for v in p[k].to_list()] for k in ("ns", "compute_ns", "comm_ns",
                                                                                  "idle_ns")},
    }
    classes = class_cycles(res)
    cls = [{"id": cl.id, "label": cl.label, "kind": cl.kind, "kept": cl.kept, "keys": keys, "text": cl.text,
            "color": STALL_COLOR if cl.kind == "stall" else CLASS_COLORS[i % len(CLASS_COLORS)]}
           for i, (cl, keys) in enumerate(classes)]
    segs = [{"segment": s.segment, "key": s.key, "first": s.first_cycle, "last": s.last_cycle}
            for s in res.steady.segments]
    fnd = []
    for i, f in enumerate(found, 1):
        where = ", ".join(x for x in (f.phase, None if f.rank is None else f"rank {f.rank}") if x)
        fnd.append({"i": i, "code": f.code, "severity": f.severity, "where": where,
                    "impact_us": round(f.impact_ns / 1e3, 1), "keys": finding_cycles(res, f, classes)})
    return {
        "ranks": sorted(set(cols["rank"])), "cycles": cols, "items": items, "kinds": kinds, "pieces": pieces,
        "pieces_cut": cut, "classes": cls, "segments": segs, "findings": fnd, "timeline": timeline_file,
        "colors": {"typical": TYPICAL_COLOR, "stall": STALL_COLOR, "left_out": LEFT_OUT_COLOR, "seam": SEAM_COLOR,
                   "gap": "#c8c8c8", "compute": COMPUTE_COLOR, "comm": COMM_COLOR, "idle": IDLE_COLOR,
                   "items": {it: color_of(it, "#999999") for it in items}},
    }


def _json_script(obj: Any) -> str:
    """``obj`` as JSON safe inside a ``<script>`` element (no ``</``, no ``<!--``)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def section_html(res: Result, found: list | None = None, timeline_file: str | None = None) -> str:
    """The chart's HTML: its data, its containers and its script (one ``<div id="cycles-view">``)."""
    d = data(res, found, timeline_file)
    if not d["cycles"]["key"]:
        return '<p class="note">No decode cycles: nothing to chart.</p>'
    link = (f' The <a href="{html.escape(timeline_file)}" download>annotated timeline</a> ({html.escape(timeline_file)}) '
            "has the same cycles op by op: open it in ui.perfetto.dev (Open trace file) or chrome://tracing."
            if timeline_file else "")
    return (
        '<div id="cycles-view">'
        '<p class="note">Every cycle\'s period (last GPU op of the previous cycle → its last), one marker per rank; '
        "colour: its class; bands: batch-size segments. Hover a cycle for its budget pieces and what names it; "
        "click to pin it and see it across ranks below; a finding's \"cycles\" link marks its cycles here."
        + link + "</p>"
        '<div id="cycles-legend" class="legend"></div>'
        '<div id="cycles-chart" class="chart" role="img" aria-label="cycle period per cycle and rank"></div>'
        '<div id="cycles-mark" class="note"></div>'
        '<div id="cycles-detail" class="detail"><p class="note">Hover or click a cycle.</p></div>'
        '<div id="cycles-gantt" class="chart"></div>'
        f'<script type="application/json" id="spectrace-cycles">{_json_script(d)}</script>'
        f"<script>{_JS}</script></div>")


CSS = """.chart{width:100%;overflow:hidden}.chart svg{display:block;max-width:100%}
.legend{font-size:12px;display:flex;flex-wrap:wrap;gap:.3em 1em;margin:.3em 0}
.legend span{white-space:nowrap}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;
border-radius:50%;vertical-align:-1px}.detail{font-size:13px;min-height:3em}
.detail table{font-size:12px}a.cyc{cursor:pointer}"""

# The chart's script: vanilla JavaScript, no library. Reads #spectrace-cycles, draws into the containers above.
_JS = r"""
(function(){
const D=JSON.parse(document.getElementById('spectrace-cycles').textContent);
const C=D.cycles,P=D.pieces,N=C.key.length,NS='http://www.w3.org/2000/svg';
const us=v=>v==null?'–':(v/1e3).toLocaleString('en-US',{minimumFractionDigits:1,maximumFractionDigits:1});
const usT=v=>(v/1e3).toLocaleString('en-US',{maximumFractionDigits:0});
const esc=s=>String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const classOf={};D.classes.forEach(c=>c.keys.forEach(k=>{(classOf[k]=classOf[k]||[]).push(c)}));
const findOf={};D.findings.forEach(f=>f.keys.forEach(k=>{(findOf[k]=findOf[k]||[]).push(f)}));
const clsById={};D.classes.forEach(c=>{if(c.id!=null)clsById[c.id]=c});
function colour(i){
  if(!C.steady[i]) return C.why[i]==='stall'?D.colors.stall:D.colors.left_out;
  if(C.slow[i]&&C.cycle_class[i]!=null&&clsById[C.cycle_class[i]]) return clsById[C.cycle_class[i]].color;
  return D.colors.typical;}
const byKey={};for(let i=0;i<N;i++){(byKey[C.key[i]]=byKey[C.key[i]]||[]).push(i)}
const pieceIdx={};for(let j=0;j<P.key.length;j++){const k=P.rank[j]+':'+P.key[j];(pieceIdx[k]=pieceIdx[k]||[]).push(j)}
const keys=Object.keys(byKey).map(Number).sort((a,b)=>a-b);
const per=C.period_ns.filter(v=>v!=null);
const lo=Math.min(...per),hi=Math.max(...per),pad=Math.max((hi-lo)*0.08,hi*0.01);
const med=per.slice().sort((a,b)=>a-b)[Math.floor(per.length/2)],LOG=hi>4*med&&lo>0;
const ymin=LOG?lo/1.15:Math.max(0,lo-pad),ymax=LOG?hi*1.15:hi+pad;
function logTicks(a,b){const out=[];for(let e=Math.floor(Math.log10(a));e<=Math.ceil(Math.log10(b));e++)
  for(const m of [1,2,5]){const v=m*Math.pow(10,e);if(v>=a&&v<=b)out.push(v)}return out}
function ticks(a,b,n){const raw=(b-a)/n,m=Math.pow(10,Math.floor(Math.log10(raw))),f=raw/m;
  const st=(f<1.5?1:f<3.5?2:f<7.5?5:10)*m,out=[];for(let v=Math.ceil(a/st)*st;v<=b;v+=st)out.push(v);return out}
const kmin=keys[0],kmax=keys[keys.length-1];
let pinned=null,marked=null;
function el(t,a,p){const e=document.createElementNS(NS,t);for(const k in a)e.setAttribute(k,a[k]);if(p)p.appendChild(e);return e}
function shape(r,x,y,s,a,p){const m=D.ranks.indexOf(r)%4;
  if(m===0) return el('circle',{cx:x,cy:y,r:s,...a},p);
  if(m===1) return el('rect',{x:x-s,y:y-s,width:2*s,height:2*s,...a},p);
  if(m===2) return el('path',{d:`M${x},${y-s*1.3}L${x+s*1.2},${y+s}L${x-s*1.2},${y+s}Z`,...a},p);
  return el('path',{d:`M${x},${y-s*1.3}L${x+s*1.3},${y}L${x},${y+s*1.3}L${x-s*1.3},${y}Z`,...a},p);}
function legend(){
  const L=document.getElementById('cycles-legend');let h='';
  h+=`<span><i style="background:${D.colors.typical}"></i>typical</span>`;
  D.classes.forEach(c=>{h+=`<span><i style="background:${c.color}"></i>${esc(c.label)} (${c.keys.length})</span>`});
  h+=`<span><i style="background:${D.colors.left_out}"></i>left out (warm-up, outside the window)</span>`;
  if(D.ranks.length>1) h+='<span>ranks: '+D.ranks.map((r,i)=>['●','■','▲','◆'][i%4]+' '+r).join(', ')+'</span>';
  L.innerHTML=h;}
function draw(){
  const box=document.getElementById('cycles-chart');box.innerHTML='';
  const W=Math.max(box.clientWidth,300),H=260,ml=62,mr=12,mt=18,mb=36;
  const svg=el('svg',{width:W,height:H,viewBox:`0 0 ${W} ${H}`},box);
  const x=k=>ml+(kmax===kmin?0.5:(k-kmin)/(kmax-kmin))*(W-ml-mr);
  const f=v=>LOG?Math.log(v):v,y=v=>mt+(1-(f(v)-f(ymin))/(f(ymax)-f(ymin)))*(H-mt-mb);
  D.segments.forEach((s,i)=>{if(D.segments.length<2)return;
    const a=x(s.first)-2,b=x(s.last)+2;
    el('rect',{x:a,y:mt,width:Math.max(b-a,1),height:H-mt-mb,fill:i%2?'#f2f2f2':'#e6eef5'},svg);
    const t=el('text',{x:a+3,y:mt-5,'font-size':10,fill:'#555'},svg);t.textContent=s.key;});
  (LOG?logTicks(ymin,ymax):ticks(ymin,ymax,4)).forEach(v=>{const yy=y(v);
    el('line',{x1:ml,x2:W-mr,y1:yy,y2:yy,stroke:'#ddd'},svg);
    const t=el('text',{x:ml-6,y:yy+4,'font-size':10,'text-anchor':'end',fill:'#444'},svg);t.textContent=usT(v);});
  const yl=el('text',{x:12,y:mt+(H-mt-mb)/2,'font-size':11,'text-anchor':'middle',fill:'#333',
    transform:`rotate(-90 12 ${mt+(H-mt-mb)/2})`},svg);yl.textContent='cycle period µs'+(LOG?' (log)':'');
  (kmax>kmin?ticks(kmin,kmax,Math.max(2,Math.floor((W-ml-mr)/80))).filter(k=>k===Math.round(k)):[kmin]).forEach(k=>{
    const t=el('text',{x:x(k),y:H-mb+14,'font-size':10,'text-anchor':'middle',fill:'#444'},svg);t.textContent=k;});
  const xl=el('text',{x:ml+(W-ml-mr)/2,y:H-4,'font-size':11,'text-anchor':'middle',fill:'#333'},svg);
  xl.textContent='cycle (as analyze numbers them)';
  D.ranks.forEach(r=>{const pts=[];for(let i=0;i<N;i++)if(C.rank[i]===r&&C.period_ns[i]!=null)pts.push([C.key[i],C.period_ns[i]]);
    pts.sort((a,b)=>a[0]-b[0]);
    el('polyline',{points:pts.map(p=>x(p[0])+','+y(p[1])).join(' '),fill:'none',stroke:'#9db3c8','stroke-width':1},svg);});
  const s=N>3000?1.6:2.8;
  for(let i=0;i<N;i++){if(C.period_ns[i]==null)continue;
    shape(C.rank[i],x(C.key[i]),y(C.period_ns[i]),s,{fill:colour(i)},svg);}
  if(marked){marked.forEach(k=>{(byKey[k]||[]).forEach(i=>{if(C.period_ns[i]==null)return;
    el('circle',{cx:x(k),cy:y(C.period_ns[i]),r:s+3.5,fill:'none',stroke:'#000','stroke-width':1.5},svg)})})}
  const cur=el('line',{x1:0,x2:0,y1:mt,y2:H-mb,stroke:'#333','stroke-dasharray':'3 2',visibility:'hidden'},svg);
  if(pinned!=null){cur.setAttribute('x1',x(pinned));cur.setAttribute('x2',x(pinned));cur.setAttribute('visibility','visible')}
  const near=ev=>{const rc=svg.getBoundingClientRect(),px=ev.clientX-rc.left;
    let best=keys[0],bd=1e18;for(const k of keys){const d=Math.abs(x(k)-px);if(d<bd){bd=d;best=k}}return best};
  svg.addEventListener('mousemove',ev=>{const k=near(ev);cur.setAttribute('x1',x(k));cur.setAttribute('x2',x(k));
    cur.setAttribute('visibility','visible');if(pinned==null)detail(k)});
  svg.addEventListener('mouseleave',()=>{if(pinned==null)cur.setAttribute('visibility','hidden')});
  svg.addEventListener('click',ev=>{pin(near(ev))});}
function pin(k){pinned=k;detail(k);gantt(k);draw();}
function detail(k){
  const box=document.getElementById('cycles-detail'),rows=byKey[k]||[];
  let h=`<b>cycle ${k}</b>`;const i0=rows[0];
  if(i0!=null&&C.batch_size[i0]!=null)h+=` · batch ${C.batch_size[i0]}`;
  h+=' · '+rows.map(i=>`rank ${C.rank[i]}: ${us(C.period_ns[i])} µs`+(C.steady[i]?'':` (left out: ${esc(C.why[i]||'')})`)).join(', ');
  const cl=(classOf[k]||[]).map(c=>esc(c.label)),fd=(findOf[k]||[]).map(f=>`#${f.i} ${esc(f.code)}`+(f.where?` (${esc(f.where)})`:''));
  h+='<br>'+(cl.length?'class: '+cl.join('; '):'no class of slower cycles names it')+' · '+(fd.length?'findings: '+fd.join('; '):'no finding names it');
  const cols=rows.map(i=>C.rank[i]);const lines={};const order=[];
  rows.forEach(i=>{(pieceIdx[C.rank[i]+':'+k]||[]).forEach(j=>{const it=D.items[P.item[j]];
    if(!(it in lines)){lines[it]={};order.push(it)}lines[it][C.rank[i]]=j})});
  if(order.length){
    h+='<div class="tw"><table><tr><th>piece</th>'+cols.map(r=>`<th>rank ${r} µs</th><th>compute / comm / idle</th>`).join('')+'</tr>';
    order.forEach(it=>{h+=`<tr><td>${esc(it)}</td>`+cols.map(r=>{const j=lines[it][r];if(j==null)return '<td class="n">–</td><td></td>';
      const sp=P.compute_ns[j]==null?'':`${us(P.compute_ns[j])} / ${us(P.comm_ns[j])} / ${us(P.idle_ns[j])}`;
      return `<td class="n">${us(P.ns[j])}</td><td class="n">${sp}</td>`}).join('')+'</tr>'});
    h+='</table></div>';}
  else h+='<p class="note">'+(D.pieces_cut?esc(D.pieces_cut):'no budget pieces for this cycle (a rank\'s first cycle has no period)')+'</p>';
  box.innerHTML=h;}
function gantt(k){
  const box=document.getElementById('cycles-gantt');box.innerHTML='';
  const rows=(byKey[k]||[]).filter(i=>C.period_ns[i]!=null&&C.i_last[i]!=null);if(!rows.length)return;
  const starts=rows.map(i=>C.i_last[i]-C.period_ns[i]);const t0=Math.min(...starts),t1=Math.max(...rows.map(i=>C.i_last[i]));
  const W=Math.max(box.clientWidth,300),lh=26,ml=62,mr=12,H=34+lh*rows.length+16;
  const svg=el('svg',{width:W,height:H,viewBox:`0 0 ${W} ${H}`},box);
  const x=t=>ml+(t-t0)/Math.max(t1-t0,1)*(W-ml-mr);
  const tt=el('text',{x:ml,y:13,'font-size':12,fill:'#222'},svg);
  tt.textContent=`cycle ${k} across ranks on the GPU clock (µs from the earliest rank's previous cycle end); hover a piece for its numbers`;
  rows.forEach((i,n)=>{const yy=22+n*lh;const lab=el('text',{x:ml-6,y:yy+15,'font-size':11,'text-anchor':'end'},svg);
    lab.textContent='rank '+C.rank[i];let t=C.i_last[i]-C.period_ns[i];
    (pieceIdx[C.rank[i]+':'+k]||[]).forEach(j=>{const w=P.ns[j],kind=D.kinds[P.kind[j]],it=D.items[P.item[j]];
      const a=Math.min(t,t+w),b=Math.max(t,t+w);
      const fill=kind==='phase'||kind==='prefill'?(D.colors.items[it]||'#999'):kind==='gap'?D.colors.gap:D.colors.seam;
      const r=el('rect',{x:x(a),y:yy,width:Math.max(x(b)-x(a),0.5),height:20,fill:fill,stroke:'#fff','stroke-width':0.5},svg);
      const ti=el('title',{},r);ti.textContent=`rank ${C.rank[i]} · ${it}: ${us(w)} µs`+(P.compute_ns[j]==null?'':
        ` (compute ${us(P.compute_ns[j])}, comm ${us(P.comm_ns[j])}, idle ${us(P.idle_ns[j])})`);
      if(x(b)-x(a)>46){const l=el('text',{x:(x(a)+x(b))/2,y:yy+14,'font-size':10,'text-anchor':'middle',fill:'#111'},svg);
        l.textContent=it.replace('seam:','')}
      t+=w;});});
  for(let g=0;g<=4;g++){const tv=t0+(t1-t0)*g/4;
    const l=el('text',{x:x(tv),y:H-3,'font-size':10,'text-anchor':g===0?'start':g===4?'end':'middle',fill:'#444'},svg);
    l.textContent=usT(tv-t0)+(g===4?' µs':'');}}
function mark(keysToMark,label){marked=keysToMark;draw();
  document.getElementById('cycles-mark').textContent=label;}
document.querySelectorAll('a[data-finding]').forEach(a=>a.addEventListener('click',ev=>{
  const f=D.findings.find(x=>String(x.i)===a.dataset.finding);if(!f)return;
  mark(f.keys,`finding #${f.i} ${f.code}: ${f.keys.length} cycle(s) circled: ${f.keys.slice(0,12).join(', ')}${f.keys.length>12?' …':''}`);
  if(f.keys.length)pin(f.keys[0]);}));
document.querySelectorAll('a[data-class]').forEach(a=>a.addEventListener('click',ev=>{
  const c=D.classes[Number(a.dataset.class)];if(!c)return;
  mark(c.keys,`${c.label}: ${c.keys.length} cycle(s) circled`);if(c.keys.length)pin(c.keys[0]);}));
legend();draw();let rt;window.addEventListener('resize',()=>{clearTimeout(rt);rt=setTimeout(()=>{draw();if(pinned!=null)gantt(pinned)},150)});
})();
"""
