// plotly.js-dist-min ships no types; nbdist only hands the module to its widget's ES module.
declare module 'plotly.js-dist-min';
