// The dashboard's entry point. Plain JavaScript modules, no build step, served from the
// binary at /dashboard/js/{module}: each page shell names its page in <body data-page>, and
// the page's module draws it from the JSON API.

import { showError } from './dom.js';
import { comparePage } from './compare.js';
import { poolsPage } from './pools.js';
import { studiesPage } from './studies.js';
import { studyPage } from './study.js';
import { trialPage } from './trial.js';

const pages = { studies: studiesPage, study: studyPage, trial: trialPage, compare: comparePage, pools: poolsPage };

// Module scripts run once the document is parsed: the body and its data-* are there.
const page = pages[document.body.dataset.page];
if (page) page().catch(showError);
